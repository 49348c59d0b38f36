{{/* The app's name label: every object of the guard carries it, Redis its own. */}}
{{- define "floorguard.labels" -}}
app.kubernetes.io/name: floorguard
{{- end }}
{{- define "floorguard.redisLabels" -}}
app.kubernetes.io/name: floorguard-redis
{{- end }}
