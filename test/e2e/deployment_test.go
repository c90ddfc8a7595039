package e2e

import (
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/fusebox-llm/fusebox/test/e2e/envoysim"
)

// shippedDeployment is the envoy/ deployment as the proxy plays it.
func shippedDeployment() envoysim.Config {
	return envoysim.Config{
		StripPrefix:   "x-fusebox-",
		GatewayHeader: "x-fusebox-gateway",
		ExtProc: envoysim.ExtProcConfig{
			RequestHeaderMode:   filterv3.ProcessingMode_SEND,
			ResponseHeaderMode:  filterv3.ProcessingMode_SEND,
			RequestBodyMode:     filterv3.ProcessingMode_BUFFERED,
			ResponseBodyMode:    filterv3.ProcessingMode_STREAMED,
			AllowModeOverride:   true,
			FailureModeAllow:    true,
			MessageTimeout:      500 * time.Millisecond,
			ResponseAttributes:  []string{"response.flags", "response.code_details"},
			ReceivingNamespaces: []string{"fusebox"},
			InitialMetadata:     map[string]string{"x-fusebox-role": "route"},
		},
		ClusterHeader:          "x-fusebox-cluster",
		RequestHeadersToRemove: []string{"x-fusebox-gateway", "x-fusebox-model", "x-fusebox-residency", "x-fusebox-cluster", "x-fusebox-route", "x-fusebox-fallbacks"},
		RouteTimeout:           3 * time.Second,
		RetryOn:                []string{"connect-failure", "reset"},
		NumRetries:             1,
		BufferLimit:            8 << 20,
	}
}
