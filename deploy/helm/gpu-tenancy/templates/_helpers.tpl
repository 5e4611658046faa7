{{/* The namespace of the controller and the agent. */}}
{{- define "gpu-tenancy.namespace" -}}
{{- .Values.namespace | default .Release.Namespace -}}
{{- end -}}

{{/* Labels of every object; add app.kubernetes.io/component where the object has one. */}}
{{- define "gpu-tenancy.labels" -}}
app.kubernetes.io/name: gpu-tenancy
app.kubernetes.io/part-of: gpu-tenancy
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "gpu-tenancy.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
