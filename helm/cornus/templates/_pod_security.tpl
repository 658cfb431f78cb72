{{/*
The restricted security context of every pod and container of the chart that runs the Cornus
image (nodes, the helm test, the rebalance hook): non-root with the image's fixed uid, read-only
root filesystem, no privilege escalation, no capabilities, the runtime's default seccomp profile.
*/}}
{{- define "cornus.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "cornus.containerSecurityContext" -}}
allowPrivilegeEscalation: false
privileged: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
{{- end }}

{{/* The small pods that only run a `cornus` client command against the client Service. */}}
{{- define "cornus.clientResources" -}}
requests:
  cpu: 50m
  memory: 96Mi
limits:
  cpu: 500m
  memory: 256Mi
{{- end }}
