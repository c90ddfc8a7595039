package judge

import (
	"strings"

	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
)

// The response flags of an access log entry that fusebox judges (R-AL4),
// in the order every shipped response_flag_filter lists them. This table
// is the only way an entry's flags reach the judging (EntryFlags), so a
// filter that lists exactly JudgedFlagNames sends every entry fusebox can
// judge and no other (envoyconfig/TestEveryConfigHasTheAccessLogChannel).
var entryFlags = []struct {
	name string
	bit  uint64
	on   func(*accesslogdatav3.ResponseFlags) bool
}{
	{"UF", FlagUF, (*accesslogdatav3.ResponseFlags).GetUpstreamConnectionFailure},
	{"UC", FlagUC, (*accesslogdatav3.ResponseFlags).GetUpstreamConnectionTermination},
	{"UR", FlagUR, (*accesslogdatav3.ResponseFlags).GetUpstreamRemoteReset},
	{"LR", FlagLR, (*accesslogdatav3.ResponseFlags).GetLocalReset},
	{"UPE", FlagUPE, (*accesslogdatav3.ResponseFlags).GetUpstreamProtocolError},
	{"UH", FlagUH, (*accesslogdatav3.ResponseFlags).GetNoHealthyUpstream},
	{"UT", FlagUT, (*accesslogdatav3.ResponseFlags).GetUpstreamRequestTimeout},
	{"UO", FlagUO, (*accesslogdatav3.ResponseFlags).GetUpstreamOverflow},
	{"NC", FlagNC, (*accesslogdatav3.ResponseFlags).GetNoClusterFound},
	{"URX", FlagURX, (*accesslogdatav3.ResponseFlags).GetUpstreamRetryLimitExceeded},
	{"DC", FlagDC, (*accesslogdatav3.ResponseFlags).GetDownstreamConnectionTermination},
	{"DR", FlagDR, (*accesslogdatav3.ResponseFlags).GetDownstreamRemoteReset},
	{"SI", FlagSI, (*accesslogdatav3.ResponseFlags).GetStreamIdleTimeout},
	{"UMSDR", FlagUMSDR, (*accesslogdatav3.ResponseFlags).GetUpstreamMaxStreamDurationReached},
	{"DT", FlagDT, (*accesslogdatav3.ResponseFlags).GetDurationTimeout},
}

// EntryFlags is the legacy bit vector of the judged flags an access log
// entry carries.
func EntryFlags(f *accesslogdatav3.ResponseFlags) uint64 {
	var flags uint64
	if f == nil {
		return 0
	}
	for _, e := range entryFlags {
		if e.on(f) {
			flags |= e.bit
		}
	}
	return flags
}

// NamedFlags is the legacy bit vector of the judged flags among names, a
// comma-separated %RESPONSE_FLAGS% ("UF,URX"; "-" for none), as a JSON
// access log line carries them (replay).
func NamedFlags(names string) uint64 {
	var flags uint64
	for rest := names; rest != ""; {
		var n string
		n, rest, _ = strings.Cut(rest, ",")
		for _, e := range entryFlags {
			if e.name == n {
				flags |= e.bit
			}
		}
	}
	return flags
}

// JudgedFlagNames are the short names of every flag fusebox judges, in
// the order the shipped response_flag_filters list them.
func JudgedFlagNames() []string {
	out := make([]string, len(entryFlags))
	for i, e := range entryFlags {
		out[i] = e.name
	}
	return out
}
