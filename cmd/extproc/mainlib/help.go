package mainlib

import (
	"fmt"
	"io"
)

// Subcommand is one of extproc's subcommands, as -h and `extproc help`
// list them.
type Subcommand struct {
	Name, Args, What string
}

// Subcommands are every subcommand extproc runs; TestHelpListsEverySubcommand
// holds the list to the dispatch. simulate is dispatched by cmd/extproc
// (it plays Envoy, which the product does not import).
var Subcommands = []Subcommand{
	{"validate", "[-config FILE] [-envoy ENVOY.yaml]", "check a config (and, with -envoy, the clusters its routes name) and exit"},
	{"config", "[-config FILE]", "print the effective config: every default applied, every policy resolved"},
	{"simulate", "[-config FILE] [-scenario outage|poison|egress] [flags]", "run fusebox on a config against a scripted outage, poison request or one pod's broken egress, with no Envoy"},
	{"replay", "-config CANDIDATE [-baseline LIVE] [-json|-html] LOG...", "replay access logs under a config: what it would have changed"},
	{"record-log", "-listen ADDR -out FILE", "receive Envoy's gRPC access log and write it for replay"},
	{"version", "", "print the version and exit"},
	{"help", "", "print this help"},
}

// usage writes extproc's usage: the server's flags (printed by the caller)
// and every subcommand.
func usage(w io.Writer) {
	fmt.Fprintf(w, "usage: extproc [flags]              run the ext_proc server\n")
	for _, s := range Subcommands {
		fmt.Fprintf(w, "       extproc %-10s %s\n                  %s\n", s.Name, s.Args, s.What)
	}
	fmt.Fprintf(w, "\nflags:\n")
}

// ExitError is an error with the exit status it asks for (cmd/extproc
// exits with Code; any other error exits 1).
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }
