{{- define "fleetcheck.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "fleetcheck.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "fleetcheck.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "fleetcheck.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "fleetcheck.coordinatorService" -}}
{{ include "fleetcheck.fullname" . }}-coordinator.{{ .Release.Namespace }}.svc
{{- end -}}

{{- define "fleetcheck.serviceAccount" -}}
{{ include "fleetcheck.fullname" . }}-coordinator
{{- end -}}

{{- define "fleetcheck.coordinatorTLSSecret" -}}
{{- if eq .Values.tls.source "cert-manager" -}}
{{ include "fleetcheck.fullname" . }}-coordinator-tls
{{- else -}}
{{ .Values.coordinator.tls.secretName }}
{{- end -}}
{{- end -}}
