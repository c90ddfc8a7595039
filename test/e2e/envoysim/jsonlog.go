package envoysim

import (
	"encoding/json"
	"io"
	"strconv"
	"strings"
	"time"
)

// WriteJSONLog writes every access log entry as the shipped configs'
// json_format line (envoy/envoy.yaml: start_time, duration_ms, ttfb_ms,
// method, path, code, flags, details, cluster, attempts, gateway, route,
// ratelimit_*, fusebox; TestJSONLogIsTheShippedFormat holds the keys to the
// file's), the lines `extproc replay` reads. Times are the entries' own
// (wall clock), or, with at, each mapped to the harness's simulated clock.
func (p *Proxy) WriteJSONLog(w io.Writer, at func(time.Time) float64) error {
	enc := json.NewEncoder(w)
	for _, e := range p.Log() {
		start := float64(e.Start.UnixNano()) / 1e9
		dur, ttfb := e.Duration.Milliseconds(), e.FirstByte.Milliseconds()
		if at != nil {
			// Every time of the line on the one clock at names (the
			// world's): a line's start and end on two clocks would put
			// its outcome where neither clock had it.
			start = at(e.Start)
			dur = int64((at(e.Start.Add(e.Duration)) - start) * 1e3)
			ttfb = int64((at(e.Start.Add(e.FirstByte)) - start) * 1e3)
		}
		line := map[string]any{
			"start_time": strconv.FormatFloat(start, 'f', 3, 64), "duration_ms": dur, "ttfb_ms": ttfb,
			"method": e.Method, "path": e.Path, "code": e.Status, "flags": flagList(e.Flags), "details": e.Details,
			"cluster": e.Cluster, "attempts": e.Attempts, "gateway": e.Gateway, "route": e.FuseboxRoute,
		}
		for i, f := range rateLimitFields {
			if v := e.RateLimit[i]; v != "" {
				line[f] = v
			} else {
				line[f] = nil // json_format: a value not there is null
			}
		}
		line["fusebox"] = nil // %DYNAMIC_METADATA(fusebox)% of a request fusebox never answered
		if md := e.Metadata["fusebox"]; md != nil {
			line["fusebox"] = md.AsMap()
		}
		if err := enc.Encode(line); err != nil {
			return err
		}
	}
	return nil
}

// flagList is %RESPONSE_FLAGS%: the short names, comma-separated, "-" for none.
func flagList(f uint64) string {
	var out []string
	for _, n := range []string{"UH", "UT", "LR", "UR", "UF", "UC", "UO", "NR", "DC", "DR", "URX", "SI", "UMSDR", "DT", "UPE", "NC"} {
		if f&flagNames[n] != 0 {
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		return "-"
	}
	return strings.Join(out, ",")
}
