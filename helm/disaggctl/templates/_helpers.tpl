{{/* Names */}}
{{- define "disaggctl.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "disaggctl.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "disaggctl.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "disaggctl.selectorLabels" -}}
app.kubernetes.io/name: {{ include "disaggctl.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "disaggctl.labels" -}}
helm.sh/chart: {{ include "disaggctl.chart" . }}
{{ include "disaggctl.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The Ray pods of this release (head and workers): NATS clients, each other's peers. */}}
{{- define "disaggctl.rayPodLabels" -}}
{{ include "disaggctl.selectorLabels" . }}
app.kubernetes.io/component: ray
{{- end -}}

{{/* TP (GPUs per worker): workers.tp, else the profile's (cluster/sim/profiles/*.yaml). */}}
{{- define "disaggctl.tp" -}}
{{- $profiles := dict "b200-llama70b-fp8-tp4" 4 "b200-nemotron340b-fp8-tp8" 8 "dynamo-mocker" 1 "h100-32b" 1 -}}
{{- if .Values.workers.tp -}}
{{- .Values.workers.tp -}}
{{- else if hasKey $profiles .Values.config.profile -}}
{{- get $profiles .Values.config.profile -}}
{{- else -}}
{{- fail (printf "workers.tp: required for profile %q (the chart knows the TP of %s)" .Values.config.profile (keys $profiles | sortAlpha | join ", ")) -}}
{{- end -}}
{{- end -}}

{{/* Worker counts from config.topology ("1P/5D"); role = "prefill" | "decode". */}}
{{- define "disaggctl.count" -}}
{{- $n := regexFindAll "[0-9]+" .root.Values.config.topology -1 -}}
{{- if ne (len $n) 2 -}}
{{- fail (printf "config.topology: must look like xP/yD, got %q" .root.Values.config.topology) -}}
{{- end -}}
{{- if eq .role "prefill" -}}{{ index $n 0 | int }}{{- else -}}{{ index $n 1 | int }}{{- end -}}
{{- end -}}

{{/* NATS: the URL without credentials, and where each role's credentials live. */}}
{{- define "disaggctl.natsHost" -}}
{{- printf "%s-nats.%s.svc" (include "disaggctl.fullname" .) .Release.Namespace -}}
{{- end -}}

{{- define "disaggctl.natsUrl" -}}
{{- if .Values.nats.enabled -}}
{{- printf "nats://%s:4222" (include "disaggctl.natsHost" .) -}}
{{- else if .Values.nats.external.url -}}
{{- .Values.nats.external.url -}}
{{- else -}}
{{- fail "nats.external.url: required when nats.enabled is false (e.g. nats://nats.example:4222)" -}}
{{- end -}}
{{- end -}}

{{- define "disaggctl.natsCredentialsSecretName" -}}
{{- if .Values.nats.auth.existingSecret -}}
{{- .Values.nats.auth.existingSecret -}}
{{- else if .Values.nats.enabled -}}
{{- printf "%s-nats-credentials" (include "disaggctl.fullname" .) -}}
{{- else -}}
{{- fail "nats.auth.existingSecret: required with an external NATS (nats.enabled: false): a Secret with <role>-password per role (cluster/nats_auth.py)" -}}
{{- end -}}
{{- end -}}

{{/* The roles a Ray pod plays (dict "root" "head"): the head runs the control plane and the
     ingress replicas (config.control_resource), so it holds their roles; a worker pod runs
     worker actors only, the worker role's. With backend: dynamo both hold Dynamo's too: the
     engines run in the worker pods, Dynamo's routers in the ingress replicas. */}}
{{- define "disaggctl.natsRayRoles" -}}
{{- if .head -}}worker ingress controller poa auction router observer{{- else -}}worker{{- end -}}
{{- if eq .root.Values.backend "dynamo" }} dynamo{{ end -}}
{{- end -}}
{{- define "disaggctl.controlResource" -}}disagg_control{{- end -}}
{{- define "disaggctl.natsRoles" -}}worker ingress controller poa auction router observer dynamo{{- end -}}

{{/* Dynamo's discovery: the chart's etcd (templates/etcd.yaml), its passwords' Secret. */}}
{{- define "disaggctl.etcdSecretName" -}}
{{- default (printf "%s-etcd" (include "disaggctl.fullname" .)) .Values.dynamo.etcd.auth.existingSecret -}}
{{- end -}}
{{- define "disaggctl.etcdUrl" -}}
{{- printf "http://%s-etcd.%s.svc:2379" (include "disaggctl.fullname" .) .Release.Namespace -}}
{{- end -}}

{{- define "disaggctl.natsTlsSecretName" -}}
{{- if not .Values.nats.tls.secretName -}}
{{- fail "nats.tls.secretName: required when nats.tls.enabled (a Secret with tls.crt, tls.key and ca.crt)" -}}
{{- end -}}
{{- .Values.nats.tls.secretName -}}
{{- end -}}

{{- define "disaggctl.natsCredentialsDir" -}}/etc/disaggctl/nats{{- end -}}

{{/* Paths inside the Ray containers. */}}
{{- define "disaggctl.configPath" -}}/etc/disaggctl/config/service.yaml{{- end -}}
{{- define "disaggctl.usersPath" -}}/etc/disaggctl/users/users.yaml{{- end -}}
{{- define "disaggctl.builderDir" -}}/etc/disaggctl/builder{{- end -}}
{{- define "disaggctl.ledgerDir" -}}/var/lib/disaggctl/ledger{{- end -}}

{{/* The PostgreSQL ledger: the chart's server, or an external one (no password in the URL:
     the head reads it from the Secret as PGPASSWORD). */}}
{{- define "disaggctl.ledgerUrl" -}}
{{- $pg := .Values.ledger.postgresql -}}
{{- if $pg.external.url -}}
{{- $pg.external.url -}}
{{- else -}}
{{- printf "postgresql://%s@%s-ledger:5432/%s" $pg.user (include "disaggctl.fullname" .) $pg.database -}}
{{- end -}}
{{- end -}}

{{- define "disaggctl.ledgerSecretName" -}}
{{- default (printf "%s-ledger" (include "disaggctl.fullname" .)) .Values.ledger.postgresql.existingSecret -}}
{{- end -}}

{{/* "true" when the chart runs the ledger's PostgreSQL server itself. */}}
{{- define "disaggctl.ledgerServer" -}}
{{- if and (eq .Values.ledger.backend "postgresql") (not .Values.ledger.postgresql.external.url) -}}true{{- end -}}
{{- end -}}

{{- define "disaggctl.ledgerCaDir" -}}/etc/disaggctl/ledger-ca{{- end -}}
{{- define "disaggctl.ledgerPasswordDir" -}}/etc/disaggctl/ledger-secret{{- end -}}

{{/* "true" when this render reaches the cluster: Helm's lookup answers (helm install,
     upgrade). helm template, a client dry run and Argo CD render offline, where lookup is
     empty and a password generated here would be a new one on every render. The probe is the
     namespace's "default" ServiceAccount, which Kubernetes puts in every namespace. */}}
{{- define "disaggctl.online" -}}
{{- if lookup "v1" "ServiceAccount" .Release.Namespace "default" -}}true{{- end -}}
{{- end -}}

{{/* Refuses to generate the Secret named by the first argument offline, unless the values
     say each render may make new passwords (generatedSecrets.offline: generate). */}}
{{- define "disaggctl.mayGenerate" -}}
{{- $root := index . 0 -}}
{{- if and (not (include "disaggctl.online" $root)) (ne $root.Values.generatedSecrets.offline "generate") -}}
{{- fail (printf "%s: this render does not reach the cluster (helm template, --dry-run, Argo CD), so a generated password would change on every render and lock out what already uses the old one. Create the Secret once and name it in %s, or install with helm install/upgrade against the cluster (for a look at the manifests only: --set generatedSecrets.offline=generate)" (index . 1) (index . 2)) -}}
{{- end -}}
{{- end -}}

{{- define "disaggctl.usersSecretName" -}}
{{- default (printf "%s-users" (include "disaggctl.fullname" .)) .Values.users.existingSecret -}}
{{- end -}}

{{- define "disaggctl.hasUsers" -}}
{{- if or .Values.users.existingSecret .Values.users.list -}}true{{- end -}}
{{- end -}}

{{/* The service config (ServeConfig fields): values.config plus what the chart decides. No
     secret: the NATS token is added by the builder from the environment. */}}
{{- define "disaggctl.serviceConfig" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- $_ := set $cfg "nats_url" (include "disaggctl.natsUrl" .) -}}
{{- if eq .Values.ledger.backend "sqlite" -}}
{{- $_ := set $cfg "ledger_path" (printf "%s/ledger.sqlite" (include "disaggctl.ledgerDir" .)) -}}
{{- else -}}
{{- $_ := set $cfg "ledger_url" (include "disaggctl.ledgerUrl" .) -}}
{{- $_ := set $cfg "ledger_schema" .Values.ledger.postgresql.schema -}}
{{- end -}}
{{- $_ := set $cfg "accelerator_resource" .Values.accelerator.resource -}}
{{- $_ := set $cfg "control_resource" (include "disaggctl.controlResource" .) -}}
{{- $_ := set $cfg "metrics_host" "0.0.0.0" -}}
{{- $_ := set $cfg "metrics_port" (int .Values.monitoring.metricsPort) -}}
{{- $_ := set $cfg "request_gpus" .Values.accelerator.gpu -}}
{{- $_ := set $cfg "backend" .Values.backend -}}
{{- if eq .Values.backend "dynamo" -}}
{{- $d := .Values.dynamo -}}
{{- $dyn := dict "engine" $d.engine "model_name" .Values.config.model_name "discovery" "etcd" "etcd_endpoints" (include "disaggctl.etcdUrl" .) "bind" "node" "log_dir" "/tmp/dynamo-logs" -}}
{{- if eq $d.engine "vllm" -}}
{{- if not (hasPrefix (printf "%s/" $d.modelCache.mountPath) $d.model) -}}
{{- fail (printf "dynamo.model: with engine vllm, a directory in the model cache (under %s/), got %q: the pods run offline (HF_HUB_OFFLINE)" $d.modelCache.mountPath $d.model) -}}
{{- end -}}
{{- $_ := set $dyn "model_path" $d.model -}}
{{- $_ := set $cfg "model_dir" $d.model -}}
{{- $_ := set $dyn "vllm_args" $d.extraArgs -}}
{{- else -}}
{{- $_ := set $dyn "num_gpu_blocks" (int $d.mocker.numGpuBlocks) -}}
{{- $_ := set $dyn "speedup_ratio" $d.mocker.speedupRatio -}}
{{- end -}}
{{- $_ := set $cfg "dynamo" $dyn -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{- define "disaggctl.image" -}}
{{- printf "%s:%s" .repository .tag -}}
{{- end -}}
