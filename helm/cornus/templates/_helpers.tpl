{{/*
Names, labels and the values every template derives from. The checks that refuse a bad
combination of values at install time (beyond what values.schema.json can say) are in
"cornus.validate", included once from the StatefulSet.
*/}}

{{/* The chart name, capped so that derived names stay DNS labels. */}}
{{- define "cornus.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 52 | trimSuffix "-" }}
{{- end }}

{{/*
The deployment the storage's cluster record names (cornus/runtime/cluster_record.py): the
namespace and the fullname, since two releases of one name in two namespaces have the same node
ids, and over the same storage would take each other's identities.
*/}}
{{- define "cornus.clusterId" -}}
{{- default (printf "%s.%s" .Release.Namespace (include "cornus.fullname" .)) .Values.clusterId -}}
{{- end }}

{{/*
The StatefulSet's name, and so every pod's ("<fullname>-<ordinal>", which is also the node id).
52 characters at most: the StatefulSet controller labels each pod with
"<name>-<10-character revision hash>", and a label value holds 63.
*/}}
{{- define "cornus.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The headless Service that gives each pod the DNS name its peers dial. */}}
{{- define "cornus.peerService" -}}
{{- printf "%s-peer" (include "cornus.fullname" .) }}
{{- end }}

{{- define "cornus.devRedisName" -}}
{{- /* 46 + "-redis": the pod's controller-revision-hash label adds 11 and must stay within 63 */}}
{{- printf "%s-redis" (include "cornus.fullname" . | trunc 46 | trimSuffix "-") }}
{{- end }}

{{- define "cornus.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "cornus.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "cornus.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of everything in the release; each resource adds its app.kubernetes.io/component. */}}
{{- define "cornus.commonLabels" -}}
helm.sh/chart: {{ include "cornus.chart" . }}
app.kubernetes.io/name: {{ include "cornus.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels of the nodes' resources (StatefulSet, Services, PodDisruptionBudget, ...). */}}
{{- define "cornus.labels" -}}
{{ include "cornus.commonLabels" . }}
app.kubernetes.io/component: node
{{- end }}

{{/* What selects the node pods (Services, PodDisruptionBudget, NetworkPolicy). */}}
{{- define "cornus.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cornus.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: node
{{- end }}

{{/*
The StatefulSet's own selector: the pods' labels plus the partition count. A StatefulSet's
selector cannot change after creation, so an upgrade that changes partitionCount is refused by the
API server even where "cornus.validate" cannot look at the cluster (helm template piped to
kubectl, GitOps controllers that render offline). Changing the partition count re-maps every key
(crc32(key) mod partitionCount) and would hide all existing data, so it must never just happen.
*/}}
{{- define "cornus.statefulSetSelectorLabels" -}}
{{ include "cornus.selectorLabels" . }}
cornus.dev/partition-count: {{ .Values.partitionCount | quote }}
{{- end }}

{{/* The host part of in-cluster DNS names. */}}
{{- define "cornus.svcDomain" -}}
{{- printf "%s.svc.%s" .Release.Namespace .Values.clusterDomain }}
{{- end }}

{{/*
Every node of the release as "<pod>=<scheme><pod>.<peer service>.<ns>.svc.<domain>:<port>", comma
separated: one loop for the peer list the nodes run with and for the list the rebalance hook checks
them against, so the two cannot name different node sets. Takes (dict "ctx" $ "port" N "scheme" S).
*/}}
{{- define "cornus.memberList" -}}
{{- $ctx := .ctx }}
{{- $fullname := include "cornus.fullname" $ctx }}
{{- $peerService := include "cornus.peerService" $ctx }}
{{- $domain := include "cornus.svcDomain" $ctx }}
{{- $members := list }}
{{- range $ordinal := until (int $ctx.Values.replicaCount) }}
{{- $pod := printf "%s-%d" $fullname $ordinal }}
{{- $members = append $members (printf "%s=%s%s.%s.%s:%d" $pod $.scheme $pod $peerService $domain (int $.port)) }}
{{- end }}
{{- join "," $members }}
{{- end }}

{{/*
CORNUS_PEERS: every node, this one included. Every pod gets the same list from the same template,
so the nodes agree on the node set, and with it on each partition's preferred owner (round-robin
over the sorted node ids).
*/}}
{{- define "cornus.peers" -}}
{{- include "cornus.memberList" (dict "ctx" . "port" .Values.ports.peer "scheme" "") }}
{{- end }}

{{/*
Each node's own REST URL, by its name under the headless Service (published before the pod is
ready), for the rebalance hook, which must hear every node rather than whichever the client
Service picks.
*/}}
{{- define "cornus.memberUrls" -}}
{{- include "cornus.memberList" (dict "ctx" . "port" .Values.ports.http "scheme" "http://") }}
{{- end }}

{{/* The client Service's in-cluster REST URL. */}}
{{- define "cornus.clientUrl" -}}
{{- printf "http://%s.%s:%d" (include "cornus.fullname" .) (include "cornus.svcDomain" .) (int .Values.service.ports.http) }}
{{- end }}

{{- define "cornus.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* The ports storage is reached on, for the NetworkPolicy's egress rule: networkPolicy.storagePorts,
else the port of the URL the chart was given (storage.redis.url, storage.dynamodb.endpoint: a
cluster that enforces the policy cut nodes off a server on any other port, and they restarted
in a loop; found by review), else the backend's usual ones. A URL held in a Secret is not seen
here: its port goes in networkPolicy.storagePorts. */}}
{{- define "cornus.storagePorts" -}}
{{- $backend := .Values.storage.backend }}
{{- $url := "" }}
{{- if eq $backend "redis" }}{{ $url = .Values.storage.redis.url }}{{ end }}
{{- if eq $backend "dynamodb" }}{{ $url = .Values.storage.dynamodb.endpoint }}{{ end }}
{{- $parsed := dict }}
{{- if $url }}{{ $parsed = urlParse $url }}{{ end }}
{{- $host := get $parsed "host" | default "" }}
{{- if .Values.networkPolicy.storagePorts }}
{{- toJson .Values.networkPolicy.storagePorts }}
{{- else if regexMatch ":[0-9]+$" $host }}
{{- toJson (list (regexFind "[0-9]+$" $host | int)) }}
{{- else if and $url (eq $backend "redis") }}
{{- toJson (list 6379) }}
{{- else if $url }}
{{- toJson (list (ternary 80 443 (eq (get $parsed "scheme") "http"))) }}
{{- else if eq $backend "redis" }}
{{- toJson (list 6379 6380) }}
{{- else if eq $backend "emulator" }}
{{- toJson list }}
{{- else }}
{{- toJson (list 443) }}
{{- end }}
{{- end }}

{{/*
The admin token's variable, from the release's secret or the one named: the nodes ask it of the
admin endpoints and of the partition listing, and the rebalance hook sends it.
*/}}
{{- define "cornus.adminTokenEnv" -}}
- name: CORNUS_ADMIN_TOKEN
  valueFrom:
    secretKeyRef:
      {{- if .Values.adminToken.existingSecret }}
      name: {{ .Values.adminToken.existingSecret | quote }}
      key: {{ .Values.adminToken.key | quote }}
      {{- else }}
      name: {{ printf "%s-admin" (include "cornus.fullname" .) | quote }}
      key: admin-token
      {{- end }}
{{- end }}

{{/*
Install-time checks of what values.schema.json cannot express (relations between values, and the
release already in the cluster). Each fails with a message that says what to change.
*/}}
{{- define "cornus.validate" -}}
{{- /* A node waits up to 60 s for its storage before its API serves (services/serve.py
STORAGE_OPEN_TIMEOUT_S), and its last try may start just before then and take a whole storage
call, then its claim of the cluster record another (found by audit, 2026-11-28); a shorter startup
probe kills every pod that waits for slow storage. */ -}}
{{- $startup := .Values.probes.startup }}
{{- $startupWaitS := add 60 (div (mul 2 (int64 .Values.storage.timeoutMsCall)) 1000) }}
{{- if le (mul (int $startup.periodSeconds) (int $startup.failureThreshold)) $startupWaitS }}
{{- fail (printf "probes.startup: periodSeconds (%d) times failureThreshold (%d) must exceed %d s, the time a node may wait for its storage at start before its API serves (60 s, then two storage calls of storage.timeoutMsCall %d ms)" (int $startup.periodSeconds) (int $startup.failureThreshold) $startupWaitS (int64 .Values.storage.timeoutMsCall)) }}
{{- end }}
{{- $replicas := int .Values.replicaCount }}
{{- $partitions := int .Values.partitionCount }}
{{- if gt $replicas $partitions }}
{{- fail (printf "replicaCount (%d) exceeds partitionCount (%d): every node should be the preferred owner of at least one partition; raise partitionCount at install time (it cannot change later) or lower replicaCount" $replicas $partitions) }}
{{- end }}
{{- if and (eq .Values.storage.backend "emulator") (gt $replicas 1) }}
{{- fail (printf "storage.backend=emulator is a SQLite file on one pod's volume: it serves one replica only (replicaCount is %d); use redis, azure_blob or dynamodb for more" $replicas) }}
{{- end }}
{{- if .Values.devRedis.enabled }}
{{- if ne .Values.storage.backend "redis" }}
{{- fail "devRedis.enabled=true needs storage.backend=redis" }}
{{- end }}
{{- if or .Values.storage.redis.existingSecret .Values.storage.redis.url }}
{{- fail "devRedis.enabled=true supplies the Redis URL itself: leave storage.redis.existingSecret and storage.redis.url empty" }}
{{- end }}
{{- else if eq .Values.storage.backend "redis" }}
{{- if not (or .Values.storage.redis.existingSecret .Values.storage.redis.url) }}
{{- fail "storage.backend=redis needs storage.redis.existingSecret (a Secret holding the redis:// or rediss:// URL, password included) or storage.redis.url (a URL without credentials), or devRedis.enabled=true" }}
{{- end }}
{{- end }}
{{- if and .Values.peerTls.enabled (not .Values.peerTls.secretName) }}
{{- fail "peerTls.enabled=true needs peerTls.secretName: a Secret holding tls.crt, tls.key and ca.crt (a cert-manager Certificate's Secret has them)" }}
{{- end }}
{{- if and (eq .Values.storage.backend "azure_blob") (not .Values.storage.azureBlob.existingSecret) }}
{{- fail "storage.backend=azure_blob needs storage.azureBlob.existingSecret: a Secret holding the storage account's connection string" }}
{{- end }}
{{- /*
The node listens on all three ports on one address (listenHost), and a Service cannot expose one
port twice: a shared port would only show as a pod that cannot bind, or a Service the API server
refuses.
*/}}
{{- $peer := int .Values.ports.peer }}
{{- $http := int .Values.ports.http }}
{{- $grpc := int .Values.ports.grpc }}
{{- if or (eq $peer $http) (eq $peer $grpc) (eq $http $grpc) }}
{{- fail (printf "ports.peer (%d), ports.http (%d) and ports.grpc (%d) must be three different ports: the node listens on each of them at listenHost" $peer $http $grpc) }}
{{- end }}
{{- if eq (int .Values.service.ports.http) (int .Values.service.ports.grpc) }}
{{- fail (printf "service.ports.http and service.ports.grpc are both %d: the client Service needs a port for each" (int .Values.service.ports.http)) }}
{{- end }}
{{- /*
The node's cross-field rules on its timeouts and limits (cornus/runtime/config.py,
load_node_config), with the node's own defaults for the values left unset, so a combination the
node would refuse fails the install instead of crash-looping every pod. Single values (positive,
at most a limit) are checked by values.schema.json. tests/deploy/test_helm_chart.py checks that
helm refuses exactly the combinations the node refuses.
*/}}
{{- $nodeDefaults := dict "clock_slack_ms" 1000 "gc_grace_ms" 12000 "backoff_ms_min" 10 "backoff_ms_max" 320 "timeout_ms_resend" 100 "lease_ms" 4000 "renew_interval_ms" 1000 "op_count_max" 1000 "txn_op_count_max" 10000 "outcome_keep_ms" 600000 "timeout_ms_peer_request" 2000 "timeout_ms_stop_collect" 15000 "timeout_ms_votes" 200 "coordinator_terminate_ms_max" 12000 "sweep_interval_ms" 60000 "sweep_age_ms" 0 }}
{{- $t := dict }}
{{- range $name, $default := $nodeDefaults }}
{{- $value := $default }}
{{- if hasKey $.Values.timeouts $name }}
{{- $value = index $.Values.timeouts $name }}
{{- end }}
{{- /* int64: a values file's numbers are floats to helm, --set's are int64 */}}
{{- $_ := set $t $name (int64 $value) }}
{{- end }}
{{- /* Kubernetes kills a pod still stopping at terminationGracePeriodSeconds: a node's stop takes
up to 29 s (services/serve.py SHUTDOWN_BUDGET_S_BUT_COLLECT) plus its collections' wait. */}}
{{- $stopMs := add 29000 $t.timeout_ms_stop_collect }}
{{- if le (mul (int64 .Values.terminationGracePeriodSeconds) 1000) $stopMs }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must exceed a node's bounded stop, %d ms: 29 s for its requests, APIs, decisions and release, plus timeouts.timeout_ms_stop_collect (%d ms) waiting for the records of its transactions to be collected (unset, %d ms, the node's default)" (int64 .Values.terminationGracePeriodSeconds) $stopMs $t.timeout_ms_stop_collect $nodeDefaults.timeout_ms_stop_collect) }}
{{- end }}
{{- $call := int64 .Values.storage.timeoutMsCall }}
{{- $graceMin := add (mul 2 $call) $t.clock_slack_ms }}
{{- if lt $t.gc_grace_ms $graceMin }}
{{- fail (printf "timeouts.gc_grace_ms is %d, but a storage call may land up to its deadline (storage.timeoutMsCall, %d) plus timeouts.clock_slack_ms (%d) after it was made, and a manual resolve makes two in a row: gc_grace_ms must be at least 2 * timeoutMsCall + clock_slack_ms = %d, or a late call could recreate a collected record (unset, gc_grace_ms is %d and clock_slack_ms %d, the node's defaults)" $t.gc_grace_ms $call $t.clock_slack_ms $graceMin $nodeDefaults.gc_grace_ms $nodeDefaults.clock_slack_ms) }}
{{- end }}
{{- /* A stopping node waits for its transactions' records to be collected, which none can be
before its grace has passed: a shorter wait gives up on the latest ones every time, and no later
pod collects them. 0 is the user's choice of no wait (the chart cannot wait minutes for a cloud
backend's grace: the node allows 60 s at most). */}}
{{- if and (gt $t.timeout_ms_stop_collect 0) (lt $t.timeout_ms_stop_collect $t.gc_grace_ms) }}
{{- fail (printf "timeouts.timeout_ms_stop_collect (%d ms) is shorter than timeouts.gc_grace_ms (%d ms): a stopping node waits that long for the records of the transactions it coordinated to be collected, which cannot happen before their grace has passed, so every rolling restart would leave the latest ones in storage for good; set timeout_ms_stop_collect to at least gc_grace_ms (and terminationGracePeriodSeconds above 29 s plus it), or to 0 for no wait (unset, timeout_ms_stop_collect is %d ms and gc_grace_ms %d ms, the node's defaults)" $t.timeout_ms_stop_collect $t.gc_grace_ms $nodeDefaults.timeout_ms_stop_collect $nodeDefaults.gc_grace_ms) }}
{{- end }}
{{- if lt $t.lease_ms (mul 2 $t.renew_interval_ms) }}
{{- fail (printf "timeouts.renew_interval_ms (%d) must be at most half of timeouts.lease_ms (%d): one slow renewal must not end a lease (unset, lease_ms is %d and renew_interval_ms %d, the node's defaults)" $t.renew_interval_ms $t.lease_ms $nodeDefaults.lease_ms $nodeDefaults.renew_interval_ms) }}
{{- end }}
{{- if and (eq .Values.storage.backend "azure_blob") (lt $t.lease_ms (add $t.renew_interval_ms 2000)) }}
{{- fail (printf "timeouts.lease_ms (%d) must be at least timeouts.renew_interval_ms (%d) + 2000 on azure_blob: a fenced write there must land before the lease its ownership record grants ends, counted from the record's Last-Modified (whole seconds) (storage_adapters/factory.py AZURE_LEASE_MARGIN_MS; unset, lease_ms is %d and renew_interval_ms %d, the node's defaults)" $t.lease_ms $t.renew_interval_ms $nodeDefaults.lease_ms $nodeDefaults.renew_interval_ms) }}
{{- end }}
{{- if gt $t.backoff_ms_min $t.backoff_ms_max }}
{{- fail (printf "timeouts.backoff_ms_min (%d) must not exceed timeouts.backoff_ms_max (%d) (unset, they are %d and %d, the node's defaults)" $t.backoff_ms_min $t.backoff_ms_max $nodeDefaults.backoff_ms_min $nodeDefaults.backoff_ms_max) }}
{{- end }}
{{- /* A coordinator resends its decision at intervals backed off from timeout_ms_resend up to
backoff_ms_max (cornus/protocol/coordinator_base.py), and its backoff cannot start above its
ceiling: rendered, every node would fail on its first commit. */}}
{{- if gt $t.timeout_ms_resend $t.backoff_ms_max }}
{{- fail (printf "timeouts.timeout_ms_resend (%d) must not exceed timeouts.backoff_ms_max (%d): a coordinator resends its decision at intervals backed off from the one up to the other (unset, they are %d and %d, the node's defaults)" $t.timeout_ms_resend $t.backoff_ms_max $nodeDefaults.timeout_ms_resend $nodeDefaults.backoff_ms_max) }}
{{- end }}
{{- if gt $t.op_count_max $t.txn_op_count_max }}
{{- fail (printf "timeouts.op_count_max (%d, per request) must not exceed timeouts.txn_op_count_max (%d, per transaction) (unset, they are %d and %d, the node's defaults)" $t.op_count_max $t.txn_op_count_max $nodeDefaults.op_count_max $nodeDefaults.txn_op_count_max) }}
{{- end }}
{{- /* DynamoDB's and Azure's requests may land up to 15 minutes late (storage_adapters/factory.py LATE_WRITE_WINDOW_MS): the tombstones must outlive that. Unset, the node lengthens its default to fit. */}}
{{- if and (has .Values.storage.backend (list "azure_blob" "dynamodb")) (hasKey .Values.timeouts "outcome_keep_ms") }}
{{- $keepMin := add $call $t.clock_slack_ms 900000 }}
{{- if lt $t.outcome_keep_ms $keepMin }}
{{- fail (printf "timeouts.outcome_keep_ms is %d, but on %s a request may land up to 900000 ms after its deadline (storage.timeoutMsCall %d, plus timeouts.clock_slack_ms %d): the tombstones garbage collection leaves must outlive it, or a late vote could recreate a collected record; outcome_keep_ms must be at least %d (unset, the node uses the least that fits)" $t.outcome_keep_ms .Values.storage.backend $call $t.clock_slack_ms $keepMin) }}
{{- end }}
{{- end }}
{{- /* A one-shot's vote may land up to its request's wait, the slack three times, a storage deadline and (on DynamoDB and Azure) 15 minutes after its begin: the decision's tombstone must stand until then (cornus/runtime/config.py _check_late_votes). */}}
{{- $lateVote := add $t.timeout_ms_peer_request (mul 3 $t.clock_slack_ms) $call }}
{{- $keepMs := $t.outcome_keep_ms }}
{{- if has .Values.storage.backend (list "azure_blob" "dynamodb") }}
{{- $lateVote = add $lateVote 900000 }}
{{- if not (hasKey .Values.timeouts "outcome_keep_ms") }}
{{- $keepMs = max $keepMs (add $call $t.clock_slack_ms 900000) }}
{{- end }}
{{- end }}
{{- if gt $lateVote (add $t.gc_grace_ms $keepMs) }}
{{- fail (printf "timeouts.timeout_ms_peer_request is %d: a one-shot's vote may land up to %d ms after its begin, after its records were collected (gc_grace_ms %d) and its tombstone dropped (outcome_keep_ms %d): lower timeout_ms_peer_request or raise outcome_keep_ms" $t.timeout_ms_peer_request $lateVote $t.gc_grace_ms $keepMs) }}
{{- end }}
{{- /* A sweeper collects a record only once no write can still reach it and the status call no
longer counts on it (cornus/protocol/sweeper.py sweep_age_ms_min): a Cornus coordinator's
termination (a request's window, two vote waits, its bound, its last call), a late vote, the grace;
then the slack twice more. 0 is the node's "the least allowed". */}}
{{- if and (gt $t.sweep_interval_ms 0) (gt $t.sweep_age_ms 0) }}
{{- $late := 0 }}
{{- if has .Values.storage.backend (list "azure_blob" "dynamodb") }}
{{- $late = 900000 }}
{{- end }}
{{- $terminations := add $t.timeout_ms_peer_request (mul 2 $t.clock_slack_ms) (mul 2 $t.timeout_ms_votes) $t.coordinator_terminate_ms_max (mul 2 $call) $t.clock_slack_ms $late }}
{{- $ageMin := add (max $terminations $lateVote $t.gc_grace_ms) (mul 2 $t.clock_slack_ms) }}
{{- if lt $t.sweep_age_ms $ageMin }}
{{- fail (printf "timeouts.sweep_age_ms is %d, below %d: a write of a transaction that old may still land (a coordinator's termination, a late vote, a manual resolve), or the status call still counts on its records; set it to at least that, or to 0 for the least allowed" $t.sweep_age_ms $ageMin) }}
{{- end }}
{{- end }}
{{- /* The release in the cluster, when there is one (lookup is empty under helm template). */}}
{{- $previous := lookup "apps/v1" "StatefulSet" .Release.Namespace (include "cornus.fullname" .) }}
{{- if $previous }}
{{- $was := index $previous.spec.selector.matchLabels "cornus.dev/partition-count" | default "" }}
{{- if and $was (ne $was (toString $partitions)) }}
{{- fail (printf "partitionCount cannot change (installed with %s, asked for %d): keys are placed by crc32(key) mod partitionCount, so a new count would hide every key already written. Keep partitionCount=%s; a different count needs a new release over empty storage" $was $partitions $was) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Where the release's other pods (the dev Redis, the rebalance hook, the helm test pod) may run: the
nodes' nodeSelector and tolerations, so they land where the node pods can (an arm64 image on
arm64 nodes; a node pool every node of which is tainted). Not the affinity: the node pods' own
spreads them from each other.
*/}}
{{- define "cornus.placement" -}}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
