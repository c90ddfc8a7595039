package mainlib

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"

	"go.yaml.in/yaml/v3"

	"github.com/fusebox-llm/fusebox/pkg/routes"
)

// Main runs extproc with args (without the program name) until ctx ends,
// then drains and returns nil. Subcommands: help.go's Subcommands.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	// The command's collector (gc.go), replay's too; in-process tests
	// keep their own.
	gc := TuneGC(os.Getenv, nil)
	if len(args) > 0 {
		switch args[0] {
		case "validate":
			return validate(args[1:], stdout, stderr)
		case "config":
			return printConfig(args[1:], stdout, stderr)
		case "replay":
			return replayCmd(args[1:], stdout, stderr)
		case "record-log":
			return recordLogCmd(args[1:], stdout, stderr)
		case "version":
			fmt.Fprintln(stdout, versionString())
			return nil
		case "help":
			_, _ = parseFlags([]string{"-h"}, stdout)
			return nil
		}
	}
	if gc.LimitErr != nil {
		fmt.Fprintln(stderr, "extproc: the container's memory limit could not be read; no GOMEMLIMIT:", gc.LimitErr)
	}
	inst, err := Start(ctx, args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	return inst.Wait()
}

func validate(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("extproc validate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "", "config file to check (default: the embedded default)")
	envoyPath := fs.String("envoy", "", "an Envoy config: every route's cluster must be one of its clusters, and every provider cluster one route's")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	var envoyProblems []string
	if *envoyPath != "" {
		ec, err := checkEnvoyFile(*path, *envoyPath)
		if err != nil {
			return err
		}
		envoyProblems = ec.Missing
		for _, w := range ec.Unused {
			fmt.Fprintln(stdout, "warning:", w)
		}
	}
	rt, err := routes.LoadFile(*path)
	if err == nil && len(envoyProblems) > 0 {
		err = &routes.ConfigError{}
	}
	if err == nil {
		if problems := startProblems(rt); len(problems) > 0 {
			err = &routes.ConfigError{Problems: problems}
		}
	}
	if err != nil {
		var ce *routes.ConfigError
		if errors.As(err, &ce) {
			for _, p := range ce.Problems {
				fmt.Fprintln(stdout, placed(nameOr(*path), p))
			}
			for _, p := range envoyProblems {
				fmt.Fprintln(stdout, p)
			}
			return fmt.Errorf("%s: %d problem(s)", nameOr(*path), len(ce.Problems)+len(envoyProblems))
		}
		return err
	}
	for _, w := range rt.Warnings {
		fmt.Fprintln(stdout, "warning:", w)
	}
	fmt.Fprintf(stdout, "%s: ok (%d gateway(s))\n", nameOr(*path), len(rt.Gateways))
	return nil
}

// printConfig prints the effective configuration as YAML: the file (or the
// embedded default) with every default applied and every policy resolved.
func printConfig(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("extproc config", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "", "config file (default: the embedded default)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	rt, err := routes.LoadFile(*path)
	if err != nil {
		return err
	}
	out, err := yaml.Marshal(rt.Effective())
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "# effective config of %s\n", nameOr(*path))
	_, err = stdout.Write(out)
	return err
}

// problemPlace is the "(line N, path)" a config problem ends with
// (routes/locate.go).
var problemPlace = regexp.MustCompile(`^(.*) \(line (\d+)(?:, ([^()]*))?\)$`)

// placed writes a config problem as file:line: path: message, as the
// -envoy cross-check and compilers write theirs (#54: before, the
// config's own problems named no file and put the place last). The
// message's own "where: " prefix (a gateway) stays.
func placed(file, problem string) string {
	m := problemPlace.FindStringSubmatch(problem)
	if m == nil {
		return file + ": " + problem
	}
	if m[3] == "" {
		return fmt.Sprintf("%s:%s: %s", file, m[2], m[1])
	}
	return fmt.Sprintf("%s:%s: %s: %s", file, m[2], m[3], m[1])
}

func nameOr(p string) string {
	if p == "" {
		return "embedded default config"
	}
	return p
}

// checkEnvoyFile runs CheckEnvoyClusters on the config at path (the
// embedded default when empty) and the Envoy file at envoyPath.
func checkEnvoyFile(path, envoyPath string) (EnvoyCheck, error) {
	fb := routes.DefaultConfig()
	if path != "" {
		var err error
		if fb, err = routes.ReadFile(path); err != nil {
			return EnvoyCheck{}, err
		}
	}
	ev, err := routes.ReadFile(envoyPath)
	if err != nil {
		return EnvoyCheck{}, err
	}
	return CheckEnvoyClusters(fb, nameOr(path), ev, envoyPath)
}
