package routes

import (
	"net/url"
	"strings"
)

// TracingProtocols are tracing.protocol's values, as OTEL_EXPORTER_OTLP_PROTOCOL spells them.
var TracingProtocols = []string{"grpc", "http/protobuf"}

// checkTracing validates the tracing section (R-TR1).
func (c *compiler) checkTracing(t TracingConfig) {
	if t.Protocol != "" && t.Protocol != "grpc" && t.Protocol != "http/protobuf" {
		c.errf("tracing.protocol: must be one of %s, got %q", strings.Join(TracingProtocols, ", "), t.Protocol)
	}
	if t.Endpoint != "" {
		u, err := url.Parse(t.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			c.errf("tracing.endpoint: must be an http:// or https:// URL with a host (the OTLP collector), got %q", t.Endpoint)
		}
	}
	if t.ServiceName != "" && strings.TrimSpace(t.ServiceName) != t.ServiceName {
		c.errf("tracing.service_name: must not begin or end with spaces, got %q", t.ServiceName)
	}
}
