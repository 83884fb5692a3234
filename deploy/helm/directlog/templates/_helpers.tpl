{{/* Names ---------------------------------------------------------------------------- */}}

{{- define "directlog.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's full name: pods are <fullname>-broker-0 and so on. Kept to 40 characters
so that "<fullname>-consensus-headless" and the like stay within 63. */}}
{{- define "directlog.fullname" -}}
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

{{- define "directlog.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Per component: (dict "root" $ "component" "broker") */}}
{{- define "directlog.componentName" -}}
{{- printf "%s-%s" (include "directlog.fullname" .root) .component -}}
{{- end -}}

{{- define "directlog.headlessName" -}}
{{- printf "%s-%s-headless" (include "directlog.fullname" .root) .component -}}
{{- end -}}

{{/* Labels ------------------------------------------------------------------------------ */}}

{{- define "directlog.selectorLabels" -}}
app.kubernetes.io/name: {{ include "directlog.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end -}}

{{- define "directlog.labels" -}}
helm.sh/chart: {{ include "directlog.chart" .root }}
{{ include "directlog.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: directlog
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Images: (dict "root" $ "image" .Values.broker.image) */}}
{{- define "directlog.image" -}}
{{- $registry := .root.Values.image.registry -}}
{{- $tag := .image.tag | default .root.Values.image.tag | default .root.Chart.AppVersion -}}
{{- if $registry -}}
{{- printf "%s/%s:%s" (trimSuffix "/" $registry) .image.repository $tag -}}
{{- else -}}
{{- printf "%s:%s" .image.repository $tag -}}
{{- end -}}
{{- end -}}

{{- define "directlog.imagePullSecrets" -}}
{{- with .Values.image.pullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Addresses ---------------------------------------------------------------------------- */}}

{{/* A pod's DNS name through its headless Service: (dict "root" $ "component" "consensus" "ordinal" 0) */}}
{{- define "directlog.podHost" -}}
{{- printf "%s-%d.%s.%s.svc.%s" (include "directlog.componentName" .) (int .ordinal) (include "directlog.headlessName" .) .root.Release.Namespace .root.Values.clusterDomain -}}
{{- end -}}

{{/* The ZooKeeper connect string of the ensemble: every member's client address. */}}
{{- define "directlog.consensusConnect" -}}
{{- $root := . -}}
{{- $hosts := list -}}
{{- range $i := until (int .Values.consensus.replicaCount) -}}
{{- $hosts = append $hosts (printf "%s:%d" (include "directlog.podHost" (dict "root" $root "component" "consensus" "ordinal" $i)) (int $root.Values.consensus.ports.client)) -}}
{{- end -}}
{{- join "," $hosts -}}
{{- end -}}

{{/* Every controller's gRPC address (a standby names the active one). */}}
{{- define "directlog.controllerAddresses" -}}
{{- $root := . -}}
{{- $hosts := list -}}
{{- range $i := until (int .Values.controller.replicaCount) -}}
{{- $hosts = append $hosts (printf "%s:%d" (include "directlog.podHost" (dict "root" $root "component" "controller" "ordinal" $i)) (int $root.Values.controller.ports.grpc)) -}}
{{- end -}}
{{- join "," $hosts -}}
{{- end -}}

{{/* Where a process listens (listenAddress): the address, or with "podIP" the pod's own IP
from the POD_IP variable (directlog.podIPEnv): "$(POD_IP)" in env values, "$POD_IP" in
shell scripts. (dict "root" $ "shell" true) */}}
{{- define "directlog.listenHost" -}}
{{- if eq .root.Values.listenAddress "podIP" -}}
{{- if .shell -}}$POD_IP{{- else -}}$(POD_IP){{- end -}}
{{- else -}}
{{- .root.Values.listenAddress -}}
{{- end -}}
{{- end -}}

{{/* The POD_IP env entry directlog.listenHost refers to, when listenAddress is "podIP". */}}
{{- define "directlog.podIPEnv" -}}
{{- if eq .Values.listenAddress "podIP" }}
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- end }}
{{- end -}}

{{/* The in-cluster bootstrap address: the brokers' client Service. */}}
{{- define "directlog.bootstrap" -}}
{{- printf "%s.%s.svc.%s:%d" (include "directlog.componentName" (dict "root" . "component" "broker")) .Release.Namespace .Values.clusterDomain (int .Values.broker.ports.internal) -}}
{{- end -}}

{{/* Security ----------------------------------------------------------------------------- */}}

{{/* A Directlog container's securityContext; (dict "root" $ "ipcLock" true) adds IPC_LOCK. */}}
{{- define "directlog.containerSecurityContext" -}}
{{- $ctx := deepCopy .root.Values.containerSecurityContext -}}
{{- if .ipcLock -}}
{{- $caps := default dict $ctx.capabilities -}}
{{- $_ := set $caps "add" (list "IPC_LOCK") -}}
{{- $_ := set $ctx "capabilities" $caps -}}
{{- end -}}
{{- toYaml $ctx -}}
{{- end -}}

{{/* Scheduling: anti-affinity by hostname and a soft spread over zones.
(dict "root" $ "component" "broker" "values" .Values.broker) */}}
{{- define "directlog.scheduling" -}}
{{- $v := .values -}}
{{- with $v.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if $v.affinity }}
affinity:
  {{- toYaml $v.affinity | nindent 2 }}
{{- else if eq $v.podAntiAffinity "hard" }}
affinity:
  podAntiAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      - topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "directlog.selectorLabels" (dict "root" .root "component" .component) | nindent 12 }}
{{- else if eq $v.podAntiAffinity "soft" }}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "directlog.selectorLabels" (dict "root" .root "component" .component) | nindent 14 }}
{{- end }}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: topology.kubernetes.io/zone
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "directlog.selectorLabels" (dict "root" .root "component" .component) | nindent 8 }}
{{- with $v.topologySpreadConstraints }}
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end -}}

{{/* Settings ------------------------------------------------------------------------------ */}}

{{/* Env entries from a settings map: (dict "prefix" "DIRECTLOG_" "config" .Values.broker.config).
Values that are maps or lists go as JSON, which the settings parse. */}}
{{- define "directlog.settingsEnv" -}}
{{- $prefix := .prefix -}}
{{- range $key, $value := .config }}
- name: {{ printf "%s%s" $prefix ($key | upper | replace "." "_" | replace "-" "_") }}
  {{- if or (kindIs "map" $value) (kindIs "slice" $value) }}
  value: {{ toJson $value | quote }}
  {{- else }}
  value: {{ include "directlog.scalar" $value | quote }}
  {{- end }}
{{- end }}
{{- end -}}

{{/* Sizes like 100Gi, 500M or 1073741824 in bytes (an int64). */}}
{{- define "directlog.bytes" -}}
{{- $s := toString . -}}
{{- $units := dict "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "Pi" 1125899906842624 "k" 1000 "K" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 "P" 1000000000000000 -}}
{{- $number := regexFind "^[0-9]+" $s -}}
{{- $unit := trimPrefix $number $s -}}
{{- if not $number -}}
{{- fail (printf "cannot read the size %q" $s) -}}
{{- end -}}
{{- if $unit -}}
{{- if not (hasKey $units $unit) -}}
{{- fail (printf "cannot read the size %q (unit %q)" $s $unit) -}}
{{- end -}}
{{- mul (int64 $number) (get $units $unit) -}}
{{- else -}}
{{- int64 $number -}}
{{- end -}}
{{- end -}}

{{/* Checks the schema cannot express (they compare two values). */}}
{{- define "directlog.validate" -}}
{{- $ext := .Values.broker.external -}}
{{- $n := int .Values.broker.replicaCount -}}
{{- if $ext.enabled -}}
{{- if and (eq $ext.type "NodePort") (lt (len $ext.nodePorts) $n) -}}
{{- fail (printf "broker.external.nodePorts: %d given, one per broker needed (broker.replicaCount is %d)" (len $ext.nodePorts) $n) -}}
{{- end -}}
{{- if and (eq $ext.type "LoadBalancer") (lt (len $ext.advertisedHosts) $n) -}}
{{- fail (printf "broker.external.advertisedHosts: %d given, a LoadBalancer needs one per broker (broker.replicaCount is %d)" (len $ext.advertisedHosts) $n) -}}
{{- end -}}
{{- if eq $ext.type "LoadBalancer" -}}
{{- range $i, $host := $ext.advertisedHosts -}}
{{- if not $host -}}
{{- fail (printf "broker.external.advertisedHosts[%d] is empty: a LoadBalancer broker advertises the name or IP clients dial" $i) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and .Values.spark.operator.enabled (not .Values.spark.enabled) -}}
{{- fail "spark.operator.enabled needs spark.enabled (the driver's ServiceAccount and Role)" -}}
{{- end -}}
{{- end -}}

{{/* The remote store's variables, the same for the broker and its tiering sidecar
(DIRECTLOG_TIERING_REMOTE and DIRECTLOG_TIERING_S3_* are both services' settings). */}}
{{- define "directlog.tieringStoreEnv" -}}
{{- $t := .Values.tiering -}}
- name: DIRECTLOG_TIERING_REMOTE
  value: {{ $t.remote | quote }}
- name: DIRECTLOG_TIERING_REMOTE_TIMEOUT_MS
  value: {{ int64 $t.remoteTimeoutMs | toString | quote }}
{{- if hasPrefix "s3://" $t.remote }}
{{- with $t.s3.endpoint }}
- name: DIRECTLOG_TIERING_S3_ENDPOINT
  value: {{ . | quote }}
{{- end }}
{{- with $t.s3.region }}
- name: DIRECTLOG_TIERING_S3_REGION
  value: {{ . | quote }}
{{- end }}
{{- if $t.s3.existingSecret }}
- name: DIRECTLOG_TIERING_S3_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ $t.s3.existingSecret }}
      key: {{ $t.s3.accessKeyKey }}
- name: DIRECTLOG_TIERING_S3_SECRET_KEY
  valueFrom:
    secretKeyRef:
      name: {{ $t.s3.existingSecret }}
      key: {{ $t.s3.secretKeyKey }}
{{- end }}
{{- end }}
{{- if hasPrefix "hdfs://" $t.remote }}
{{- with $t.hdfs.user }}
- name: HADOOP_USER_NAME
  value: {{ . | quote }}
{{- end }}
{{- if $t.hdfs.configMap }}
- name: HADOOP_CONF_DIR
  value: /etc/hadoop/conf
{{- end }}
{{- end }}
{{- end -}}

{{- define "directlog.tieringStoreMounts" -}}
{{- $t := .Values.tiering -}}
{{- if and (hasPrefix "hdfs://" $t.remote) $t.hdfs.configMap }}
- name: hadoop-conf
  mountPath: /etc/hadoop/conf
  readOnly: true
{{- end }}
{{- with $t.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Scrape relabelling: the job name, and Strimzi's labels (namespace, kubernetes_pod_name,
strimzi_io_cluster = the prefix of every pod name, strimzi_io_kind, strimzi_io_name).
(dict "root" $ "job" "directlog-broker" "strimzi" "kafka") */}}
{{- define "directlog.scrapeRelabelings" -}}
{{- $fullname := include "directlog.fullname" .root -}}
- targetLabel: job
  replacement: {{ .job }}
  action: replace
- sourceLabels: [__meta_kubernetes_namespace]
  targetLabel: namespace
  action: replace
- sourceLabels: [__meta_kubernetes_pod_name]
  targetLabel: pod
  action: replace
- sourceLabels: [__meta_kubernetes_pod_name]
  targetLabel: kubernetes_pod_name
  action: replace
- sourceLabels: [__meta_kubernetes_pod_container_name]
  targetLabel: container
  action: replace
- sourceLabels: [__meta_kubernetes_pod_node_name]
  targetLabel: node_name
  action: replace
- targetLabel: strimzi_io_cluster
  replacement: {{ $fullname }}
  action: replace
{{- if eq .strimzi "kafka" }}
- targetLabel: strimzi_io_kind
  replacement: Kafka
  action: replace
- targetLabel: strimzi_io_name
  replacement: {{ $fullname }}-kafka
  action: replace
{{- end }}
{{- end -}}

{{/* services/broker/kafka_exporter.py: one instance for the Kafka Exporter series. */}}
{{- define "directlog.exporterRelabeling" -}}
- sourceLabels: [__name__]
  regex: kafka_(brokers|broker_info|topic_.+|consumergroup_.+)
  targetLabel: instance
  replacement: directlog
  action: replace
{{- end -}}

{{/* A value as text; whole numbers without an exponent (YAML numbers reach templates as
floats: 86400000 would print as 8.64e+07). */}}
{{- define "directlog.scalar" -}}
{{- if and (kindIs "float64" .) (eq (float64 (int64 .)) .) -}}
{{- int64 . | toString -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}

{{/* The traffic job's arguments (python -m pipelines.traffic.job --help). */}}
{{- define "directlog.sparkJobArgs" -}}
{{- $s := .Values.spark -}}
{{- $args := list "--bootstrap" (include "directlog.bootstrap" .) "--checkpoint" $s.checkpoint.path "--master" $s.master -}}
{{- $args = concat $args (list "--counts-topic" $s.job.countsTopic "--speeds-topic" $s.job.speedsTopic "--aggregates-topic" $s.job.aggregatesTopic "--delays-topic" $s.job.delaysTopic) -}}
{{- $args = concat $args (list "--starting-offsets" $s.job.startingOffsets "--window" $s.job.window "--watermark" $s.job.watermark "--shuffle-partitions" (include "directlog.scalar" $s.job.shufflePartitions)) -}}
{{- if $s.job.rdmaConsume -}}
{{- $args = append $args "--rdma-consume" -}}
{{- end -}}
{{- toJson $args -}}
{{- end -}}
