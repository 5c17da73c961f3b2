{{/*
Names. The full name is the release name when it already contains the chart name, so
`helm install ursula charts/ursula` names the services ursula-gateway and ursula-indexer,
the names applications are written against.
*/}}
{{- define "ursula.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ursula.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Suffixed names are cut so that the suffix always survives the 63-character limit. */}}
{{- define "ursula.gatewayName" -}}
{{- printf "%s-gateway" (include "ursula.fullname" . | trunc 55 | trimSuffix "-") }}
{{- end }}

{{- define "ursula.serverName" -}}
{{- include "ursula.fullname" . }}
{{- end }}

{{- define "ursula.headlessName" -}}
{{- printf "%s-headless" (include "ursula.fullname" . | trunc 54 | trimSuffix "-") }}
{{- end }}

{{- define "ursula.indexerName" -}}
{{- printf "%s-indexer" (include "ursula.fullname" . | trunc 55 | trimSuffix "-") }}
{{- end }}

{{- define "ursula.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ursula.labels" -}}
helm.sh/chart: {{ include "ursula.chart" . }}
app.kubernetes.io/name: {{ include "ursula.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels of one component: server or indexer. Never change once released. */}}
{{- define "ursula.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ursula.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "ursula.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "ursula.serverServiceAccountName" -}}
{{- if .Values.server.serviceAccount.create }}
{{- default (printf "%s-server" (include "ursula.fullname" . | trunc 56 | trimSuffix "-")) .Values.server.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.server.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "ursula.indexerServiceAccountName" -}}
{{- if .Values.indexer.serviceAccount.create }}
{{- default (include "ursula.indexerName" .) .Values.indexer.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.indexer.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
One TOML value. Helm reads every number of a values file as a float, and the server and
the indexer refuse a float where they expect an integer, so whole numbers are written
without a fraction; strings are quoted with TOML's (JSON-compatible) basic-string escapes.
*/}}
{{- define "ursula.tomlValue" -}}
{{- $v := . }}
{{- if kindIs "string" $v }}
{{- toJson $v }}
{{- else if kindIs "bool" $v }}
{{- ternary "true" "false" $v }}
{{- else if or (kindIs "float64" $v) (kindIs "int" $v) (kindIs "int64" $v) }}
{{- if eq (float64 $v) (floor $v) }}
{{- printf "%d" (int64 $v) }}
{{- else }}
{{- fail (printf "TOML value %v: only whole numbers are accepted" $v) }}
{{- end }}
{{- else if kindIs "slice" $v }}
{{- $items := list }}
{{- range $v }}
{{- $items = append $items (include "ursula.tomlValue" .) }}
{{- end }}
{{- printf "[%s]" (join ", " $items) }}
{{- else }}
{{- fail (printf "TOML value %v: unsupported type %s" $v (kindOf $v)) }}
{{- end }}
{{- end }}

{{/* The S3 credentials of s3.existingSecret as container environment entries. */}}
{{- define "ursula.s3CredentialsEnv" -}}
{{- if .Values.s3.existingSecret }}
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
{{- end }}
{{- end }}
