{{/* Names, labels and the security settings every pod template shares. */}}

{{- define "g2rpo.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "g2rpo.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: g2rpo
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "g2rpo.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "g2rpo.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name: name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "g2rpo.image" -}}
{{- $image := index .root.Values.images .which -}}
{{- printf "%s:%s" $image.repository (default .root.Chart.AppVersion $image.tag) -}}
{{- end -}}

{{/* The training pods' labels: the PodMonitor and the NetworkPolicy select on these. */}}
{{- define "g2rpo.trainerPodLabels" -}}
app.kubernetes.io/part-of: g2rpo
app.kubernetes.io/component: trainer
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Restricted Pod Security Standard, pod level. */}}
{{- define "g2rpo.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Restricted Pod Security Standard, container level; `add` lists the capabilities an exception needs. */}}
{{- define "g2rpo.containerSecurityContext" -}}
allowPrivilegeEscalation: false
privileged: false
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
  {{- with .add }}
  add: {{ toJson . }}
  {{- end }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* S3 settings as environment: key material only by reference to an existing Secret. */}}
{{- define "g2rpo.s3Env" -}}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ .Values.s3.existingSecret }}
      key: {{ .Values.s3.accessKeyIdKey }}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.s3.existingSecret }}
      key: {{ .Values.s3.secretAccessKeyKey }}
- name: AWS_REGION
  value: {{ .Values.s3.region | quote }}
{{- if .Values.s3.endpoint }}
- name: AWS_ENDPOINT_URL_S3
  value: {{ .Values.s3.endpoint | quote }}
{{- else }}
{{- /* The endpoint from the Secret where it holds one (MinIO, SeaweedFS, Ceph); none: AWS. */}}
- name: AWS_ENDPOINT_URL_S3
  valueFrom:
    secretKeyRef:
      name: {{ .Values.s3.existingSecret }}
      key: {{ .Values.s3.endpointKey }}
      optional: true
{{- end }}
{{- with .Values.s3.registryUri }}
- name: G2RPO_REGISTRY_URI
  value: {{ . | quote }}
{{- end }}
{{- end -}}
