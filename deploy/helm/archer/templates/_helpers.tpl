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

{{/* The uninstall hook's own service account (docs "Safety net"). */}}
{{- define "archer.ungateServiceAccountName" -}}
{{- printf "%s-ungate" (include "archer.fullname" .) -}}
{{- end -}}

{{/* The second scheduler's image: extender.secondScheduler.image, else kube-scheduler at the
cluster's own version (an EKS or AKS suffix such as -eks-1552ad0 dropped). A given image's tag
must be the cluster's minor version or one older: Kubernetes' version skew policy lets
kube-scheduler trail kube-apiserver by one minor version, never lead it. */}}
{{- define "archer.schedulerImage" -}}
{{- $cluster := regexFind "^v?[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version | trimPrefix "v" -}}
{{- $image := .Values.extender.secondScheduler.image -}}
{{- if not $image -}}
{{- printf "registry.k8s.io/kube-scheduler:v%s" $cluster -}}
{{- else -}}
{{- $tag := regexFind ":v?[0-9]+\\.[0-9]+" $image | trimPrefix ":" | trimPrefix "v" -}}
{{- if $tag -}}
{{- $want := splitList "." $cluster -}}
{{- $got := splitList "." $tag -}}
{{- $skew := sub (int (index $want 1)) (int (index $got 1)) -}}
{{- if or (ne (index $want 0) (index $got 0)) (lt $skew 0) (gt $skew 1) -}}
{{- fail (printf "extender.secondScheduler.image %s is kube-scheduler %s, but the cluster runs Kubernetes %s: the scheduler must be the same minor version or one older (Kubernetes' version skew policy); leave the image empty to follow the cluster" $image $tag $cluster) -}}
{{- end -}}
{{- end -}}
{{- $image -}}
{{- end -}}
{{- end -}}

{{/* The pods' ports (ports.https, ports.admin), with their defaults where a release upgraded
with --reuse-values from a chart without them carries none. */}}
{{- define "archer.httpsPort" -}}
{{- dig "https" 8443 (.Values.ports | default dict) -}}
{{- end -}}
{{- define "archer.adminPort" -}}
{{- dig "admin" 8080 (.Values.ports | default dict) -}}
{{- end -}}
