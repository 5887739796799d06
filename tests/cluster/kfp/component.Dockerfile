# A KFP 2.17.0 backend binary from ../shared/tools/kfp (persistence_agent or scheduledworkflow, unpacked into the
# build context by tests/cluster/kfp_backend.py) as an image: both run in a pod, since their Argo clients take
# in-cluster config only. Numeric non-root user, as the driver and launcher images of the tool.
ARG BASE_IMAGE=localhost/debian-py311:bookworm
FROM ${BASE_IMAGE}
ARG BINARY
COPY ${BINARY} /bin/kfp-component
USER 65532
ENTRYPOINT ["/bin/kfp-component"]
