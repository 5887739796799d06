"""Models: the Flux velocity adapter, the tiny-pipeline factory and model loading.

- :mod:`g2rpo.models.flux` — :class:`~g2rpo.models.flux.FluxVelocity` turns a diffusers
  ``FluxTransformer2DModel`` into the core's velocity model; :class:`~g2rpo.models.flux.FluxConditioning`
  holds the text embeddings; latent packing, noise and VAE decoding live next to them.
- :mod:`g2rpo.models.tiny` — a complete tiny ``FluxPipeline`` of the real classes (``g2rpo model
  init-tiny``), for tests and the demo.
- :mod:`g2rpo.models.loading` — model locations (local directory or ``s3://``), checks that name
  what is missing, and the ``from_pretrained`` calls that load the real FLUX.1-dev and the tiny
  model alike.

Importing this package is cheap; torch and diffusers are imported by the submodules.
"""
