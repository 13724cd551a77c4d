{{/* The name every object carries: fullnameOverride, else the release name when it already
names the chart, else <release>-archer. */}}
{{- define "archer.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "archer.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "archer.labels" -}}
{{ include "archer.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "archer.serviceAccountName" -}}
{{- default (include "archer.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "archer.tlsSecretName" -}}
{{- if eq .Values.tls.mode "secret" -}}
{{- default (printf "%s-tls" (include "archer.fullname" .)) .Values.tls.secretName -}}
{{- else -}}
{{- printf "%s-tls" (include "archer.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* Archer's config file: .Values.config with .Values.provisioner as its provisioner section
(the second scheduler, when enabled, among the schedulers whose pods are planned at once). */}}
{{- define "archer.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- $prov := deepCopy .Values.provisioner -}}
{{- if .Values.extender.secondScheduler.enabled -}}
{{- $names := default (list "default-scheduler") $prov.schedulerNames -}}
{{- $_ := set $prov "schedulerNames" (append $names .Values.extender.secondScheduler.schedulerName | uniq) -}}
{{- end -}}
{{- $_ := set $cfg "provisioner" $prov -}}
{{- if .Values.registryHosts -}}
{{- $reg := deepCopy (default dict $cfg.registry) -}}
{{- $_ := set $reg "hostsDir" "/etc/archer/certs.d" -}}
{{- $_ := set $cfg "registry" $reg -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* Values that each pass the schema but not together. */}}
{{- define "archer.validate" -}}
{{- $decision := int (dig "webhook" "decisionTimeoutSeconds" 4 .Values.config) -}}
{{- if ge $decision (int .Values.webhook.timeoutSeconds) -}}
{{- fail (printf "config.webhook.decisionTimeoutSeconds (%d) must be below webhook.timeoutSeconds (%d): Archer must answer before the API server gives up on it" $decision (int .Values.webhook.timeoutSeconds)) -}}
{{- end -}}
{{- if and (eq .Values.provisioner.cloudProvider "aws") (not (dig "aws" "clusterName" "" .Values.provisioner)) -}}
{{- fail "provisioner.aws.clusterName is required when provisioner.cloudProvider is aws: every instance Archer launches is tagged with it" -}}
{{- end -}}
{{- end -}}

{{/* "true" when the safety net runs (config.safetyNet.enabled, on by default), else empty. */}}
{{- define "archer.safetyNet" -}}
{{- if dig "safetyNet" "enabled" true .Values.config -}}true{{- end -}}
{{- end -}}

{{/* The safety net's record: the one ConfigMap Archer may write (config.safetyNet.configMap). */}}
{{- define "archer.safetyRecordName" -}}
{{- dig "safetyNet" "configMap" "archer-safety-net" .Values.config -}}
{{- end -}}

{{/* The uninstall hook's own service account (README "Safety net"). */}}
{{- define "archer.ungateServiceAccountName" -}}
{{- printf "%s-ungate" (include "archer.fullname" .) -}}
{{- end -}}
