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
{{- $hosts = append $hosts (printf "%s:%d" (include "directlog.podHost" (dict "root" $root "component" "consensus" "ordinal" $i)) (int (include "directlog.consensusClientPort" $root))) -}}
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
{{- include "directlog.validateSecurity" . -}}
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

{{/* Security ---------------------------------------------------------------------------
What `security` turns on, worked out once: (include "directlog.security" $ | fromJson).
- listeners: the brokers' Kafka listeners in order (INTERNAL, EXTERNAL, REPLICATION), each
  {name, protocol, tls, sasl, clientAuth, mechanisms} with clientAuth and mechanisms the
  listener's own setting or else the broker-wide one (ownClientAuth, ownMechanisms: its own);
- interBroker: the inter-broker listener's entry; internal: INTERNAL's;
- tls / sasl: some listener uses TLS / SASL; links: mutual TLS between the services;
- adminClient: the chart's admin clients (topics Job, drain hook, the CLI in a broker
  container) need INTERNAL's client settings, and admin: their SASL login {mechanism,
  username, existingSecret, passwordKey};
- superUsers: authorization.superUsers and the brokers' own user on a SASL inter-broker
  listener. */}}
{{- define "directlog.security" -}}
{{- $s := .Values.security -}}
{{- $l := $s.listeners -}}
{{- $given := list (dict "name" "INTERNAL" "values" $l.internal) -}}
{{- if .Values.broker.external.enabled -}}
{{- $given = append $given (dict "name" "EXTERNAL" "values" $l.external) -}}
{{- end -}}
{{- if $l.interBroker.enabled -}}
{{- $given = append $given (dict "name" "REPLICATION" "values" $l.interBroker) -}}
{{- end -}}
{{- $listeners := list -}}
{{- $tls := false -}}
{{- $sasl := false -}}
{{- range $given -}}
{{- $protocol := .values.protocol -}}
{{- $isTls := has $protocol (list "SSL" "SASL_SSL") -}}
{{- $isSasl := has $protocol (list "SASL_PLAINTEXT" "SASL_SSL") -}}
{{- $tls = or $tls $isTls -}}
{{- $sasl = or $sasl $isSasl -}}
{{- $listeners = append $listeners (dict "name" .name "protocol" $protocol "tls" $isTls "sasl" $isSasl "ownClientAuth" (.values.sslClientAuth | default "") "ownMechanisms" (.values.saslMechanisms | default list) "clientAuth" (.values.sslClientAuth | default $s.tls.clientAuth) "mechanisms" (.values.saslMechanisms | default $s.sasl.enabledMechanisms)) -}}
{{- end -}}
{{- $internal := first $listeners -}}
{{- $interBroker := $internal -}}
{{- if $l.interBroker.enabled -}}
{{- $interBroker = last $listeners -}}
{{- end -}}
{{- $admin := $s.sasl.admin -}}
{{- if not $admin.username -}}
{{- $admin = $s.sasl.interBroker -}}
{{- end -}}
{{- $superUsers := $s.authorization.superUsers | default list -}}
{{- if $interBroker.sasl -}}
{{- $superUsers = append $superUsers (printf "User:%s" $s.sasl.interBroker.username) -}}
{{- end -}}
{{- toJson (dict "listeners" $listeners "internal" $internal "interBroker" $interBroker "tls" $tls "sasl" $sasl "links" $s.serviceLinks.enabled "adminClient" (ne $internal.protocol "PLAINTEXT") "admin" $admin "superUsers" ($superUsers | uniq)) -}}
{{- end -}}

{{/* Where the Secrets are mounted, each as a whole volume (a subPath would never see a
renewal): the Kafka listeners' certificate, the service links' certificate of the pod's
component, the SCRAM bootstrap users. */}}
{{- define "directlog.kafkaTlsDir" -}}/var/run/secrets/directlog/kafka-tls{{- end -}}
{{- define "directlog.linkTlsDir" -}}/var/run/secrets/directlog/link-tls{{- end -}}
{{- define "directlog.scramUsersDir" -}}/var/run/secrets/directlog/scram-users{{- end -}}

{{/* The chart's admin clients (the topics Job, the drain hook, `directlog` in a broker
container) with a secured INTERNAL listener: its client settings as DIRECTLOG_CLIENT_<NAME>
variables, NAME the Kafka client property (directlog/admin/client_config.py), which the
admin CLI and every admin session read. The brokers' settings ignore them. */}}
{{- define "directlog.adminClientEnv" -}}
{{- $s := .Values.security -}}
{{- $sec := include "directlog.security" . | fromJson -}}
{{- $internal := $sec.internal -}}
{{- if $sec.adminClient }}
- name: DIRECTLOG_CLIENT_SECURITY_PROTOCOL
  value: {{ $internal.protocol }}
{{- if $internal.sasl }}
- name: DIRECTLOG_CLIENT_SASL_MECHANISM
  value: {{ $sec.admin.mechanism }}
- name: DIRECTLOG_CLIENT_SASL_USERNAME
  value: {{ $sec.admin.username | quote }}
- name: DIRECTLOG_CLIENT_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $sec.admin.existingSecret }}
      key: {{ $sec.admin.passwordKey }}
{{- end }}
{{- if $internal.tls }}
- name: DIRECTLOG_CLIENT_SSL_CA_LOCATION
  value: {{ include "directlog.kafkaTlsDir" . }}/ca.crt
{{- if ne $internal.clientAuth "none" }}
# INTERNAL asks for a client certificate: the brokers' own.
- name: DIRECTLOG_CLIENT_SSL_CERTIFICATE_LOCATION
  value: {{ include "directlog.kafkaTlsDir" . }}/tls.crt
- name: DIRECTLOG_CLIENT_SSL_KEY_LOCATION
  value: {{ include "directlog.kafkaTlsDir" . }}/tls.key
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* A TlsFiles setting as JSON for the files of a kubernetes.io/tls Secret mounted at a
directory: (include "directlog.tlsFiles" "/var/run/secrets/directlog/link-tls") */}}
{{- define "directlog.tlsFiles" -}}
{{- toJson (dict "cert_file" (printf "%s/tls.crt" .) "key_file" (printf "%s/tls.key" .) "ca_file" (printf "%s/ca.crt" .)) -}}
{{- end -}}

{{/* A listener's own TLS client auth and SASL mechanisms, as the fields that follow its
other ones in DIRECTLOG_LISTENERS (nothing when it has none of its own).
(dict "security" $security "name" "INTERNAL") */}}
{{- define "directlog.listenerExtras" -}}
{{- $name := .name -}}
{{- range .security.listeners -}}
{{- if eq .name $name -}}
{{- if and .tls .ownClientAuth -}},"ssl_client_auth":{{ toJson .ownClientAuth }}{{- end -}}
{{- if and .sasl .ownMechanisms -}},"sasl_enabled_mechanisms":{{ toJson .ownMechanisms }}{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The consensus members' client port: the TLS one with the service links secured. */}}
{{- define "directlog.consensusClientPort" -}}
{{- if .Values.security.serviceLinks.enabled -}}
{{- .Values.consensus.ports.secureClient -}}
{{- else -}}
{{- .Values.consensus.ports.client -}}
{{- end -}}
{{- end -}}

{{/* Security settings that depend on each other or on other values. */}}
{{- define "directlog.validateSecurity" -}}
{{- $s := .Values.security -}}
{{- $sec := include "directlog.security" . | fromJson -}}
{{- range $sec.listeners -}}
{{- if and .tls (not $s.tls.existingSecret) -}}
{{- fail (printf "the %s listener is %s: set security.tls.existingSecret, the Secret with the brokers' certificate (tls.crt, tls.key, ca.crt)" .name .protocol) -}}
{{- end -}}
{{- end -}}
{{- $ib := $sec.interBroker -}}
{{- if $ib.sasl -}}
{{- if not $s.sasl.interBroker.existingSecret -}}
{{- fail (printf "the inter-broker listener %s is %s: set security.sasl.interBroker.existingSecret, the Secret with the password of %q" $ib.name $ib.protocol $s.sasl.interBroker.username) -}}
{{- end -}}
{{- if not (has $s.sasl.interBroker.mechanism $ib.mechanisms) -}}
{{- fail (printf "security.sasl.interBroker.mechanism %s is not enabled on the inter-broker listener %s (%s)" $s.sasl.interBroker.mechanism $ib.name (join ", " $ib.mechanisms)) -}}
{{- end -}}
{{- end -}}
{{- $internal := $sec.internal -}}
{{- if $internal.sasl -}}
{{- if not $sec.admin.existingSecret -}}
{{- fail (printf "the INTERNAL listener is %s: the chart's admin clients (the topics Job, the scale-down drain hook) log in as security.sasl.admin, else as security.sasl.interBroker: set the existingSecret of one" $internal.protocol) -}}
{{- end -}}
{{- if not (has $sec.admin.mechanism $internal.mechanisms) -}}
{{- fail (printf "the admin clients' SASL mechanism %s is not enabled on the INTERNAL listener (%s)" $sec.admin.mechanism (join ", " $internal.mechanisms)) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.spark.enabled (ne $internal.protocol "PLAINTEXT") -}}
{{- fail (printf "spark.enabled with the INTERNAL listener %s: the directlog Spark data source reads over PLAINTEXT only" $internal.protocol) -}}
{{- end -}}
{{- end -}}

{{/* The brokers' security settings (docs/security.md), each only when it is in use, so a
render without `security` is what it was. */}}
{{- define "directlog.brokerSecurityEnv" -}}
{{- $s := .Values.security -}}
{{- $sec := include "directlog.security" . | fromJson -}}
{{- if $sec.tls }}
- name: DIRECTLOG_SSL
  value: {{ include "directlog.tlsFiles" (include "directlog.kafkaTlsDir" .) | quote }}
- name: DIRECTLOG_SSL_CLIENT_AUTH
  value: {{ $s.tls.clientAuth | quote }}
{{- end }}
{{- if $sec.sasl }}
- name: DIRECTLOG_SASL_ENABLED_MECHANISMS
  value: {{ toJson $s.sasl.enabledMechanisms | quote }}
{{- end }}
{{- if $sec.interBroker.sasl }}
- name: DIRECTLOG_INTER_BROKER_SASL_MECHANISM
  value: {{ $s.sasl.interBroker.mechanism | quote }}
- name: DIRECTLOG_INTER_BROKER_SASL_USERNAME
  value: {{ $s.sasl.interBroker.username | quote }}
- name: DIRECTLOG_INTER_BROKER_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $s.sasl.interBroker.existingSecret }}
      key: {{ $s.sasl.interBroker.passwordKey }}
{{- end }}
{{- if $s.authorization.enabled }}
- name: DIRECTLOG_AUTHORIZER_ENABLED
  value: "true"
- name: DIRECTLOG_SUPER_USERS
  value: {{ toJson $sec.superUsers | quote }}
- name: DIRECTLOG_ALLOW_EVERYONE_IF_NO_ACL_FOUND
  value: {{ $s.authorization.allowEveryoneIfNoAclFound | quote }}
{{- end }}
{{- if $sec.links }}
- name: DIRECTLOG_CONTROLLER_TLS
  value: {{ include "directlog.tlsFiles" (include "directlog.linkTlsDir" .) | quote }}
{{- if .Values.tiering.enabled }}
- name: DIRECTLOG_TIERING_TLS
  value: {{ include "directlog.tlsFiles" (include "directlog.linkTlsDir" .) | quote }}
{{- end }}
{{- end }}
{{- end -}}
