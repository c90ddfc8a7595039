package mainlib

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestHelpListsEverySubcommand (#37): `extproc help` and `-h` list every
// subcommand, and every subcommand listed is one Main runs. Before, -h
// named validate, config and version only, and there was no help.
func TestHelpListsEverySubcommand(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"-h"}} {
		var out, errb bytes.Buffer
		if err := Main(context.Background(), args, &out, &errb); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		text := out.String() + errb.String()
		for _, s := range Subcommands {
			if !strings.Contains(text, "extproc "+s.Name) {
				t.Errorf("%v does not list %s", args, s.Name)
			}
		}
		if !strings.Contains(text, "-config") {
			t.Errorf("%v lists no flags", args)
		}
	}
	for _, s := range Subcommands {
		if s.Name == "simulate" || s.Name == "help" || s.Name == "version" {
			continue // simulate is cmd/extproc's; the other two take no flags
		}
		var out, errb bytes.Buffer
		err := Main(context.Background(), []string{s.Name, "-h"}, &out, &errb)
		if err != nil && !errors.Is(err, flag.ErrHelp) {
			t.Errorf("extproc %s -h: %v", s.Name, err)
		}
	}
}

// TestReplayOfJunkExitsTwo (#37, R-R6): replaying a file that holds no
// access log line is an error with exit status 2, naming the first
// malformed lines. Before, it printed an empty report and exited 0.
func TestReplayOfJunkExitsTwo(t *testing.T) {
	junk := filepath.Join(t.TempDir(), "junk.log")
	if err := os.WriteFile(junk, []byte("hello\nnot a log\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	err := Main(context.Background(), []string{"replay", "-config", "../../../deploy/fusebox.example.yaml", junk}, &out, &errb)
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Code != 2 {
		t.Fatalf("%v, want exit status 2", err)
	}
	if !strings.Contains(errb.String(), junk+":1: not a JSON object") {
		t.Fatalf("stderr does not name the malformed lines:\n%s", errb.String())
	}
}

// #54: replay says when it could not do what was asked. A config that
// matches none of the lines (every one names a gateway or model it lacks)
// exits 2 saying so, and a truncated gzip names its file and says what is
// wrong with it. Before: an empty table with exit 0, and "unexpected EOF"
// with no file name.
func TestReplaySaysWhatWentWrong(t *testing.T) {
	dir := t.TempDir()
	line := `{"start_time":"1764590400.000","duration_ms":12,"code":200,"flags":"-","details":"via_upstream","cluster":"c","gateway":"nosuch","fusebox":{"decision":"d","model":"m"}}` + "\n"
	plain := filepath.Join(dir, "other.log")
	if err := os.WriteFile(plain, []byte(strings.Repeat(line, 3)), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	err := Main(context.Background(), []string{"replay", "-config", "../../../deploy/fusebox.example.yaml", plain}, &out, &errb)
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Code != 2 || !strings.Contains(err.Error(), "matches none of the 3 lines") {
		t.Fatalf("a config that matches no line: %v, want exit status 2 saying so", err)
	}

	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	for range 2000 {
		fmt.Fprintf(zw, "%s", strings.Replace(line, "nosuch", "default", 1))
	}
	zw.Close()
	cut := filepath.Join(dir, "cut.log.gz")
	if err := os.WriteFile(cut, gz.Bytes()[:gz.Len()/2], 0o600); err != nil {
		t.Fatal(err)
	}
	err = Main(context.Background(), []string{"replay", "-config", "../../../deploy/fusebox.example.yaml", cut}, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), cut) || !strings.Contains(err.Error(), "ends early") {
		t.Fatalf("a truncated gzip: %v, want its name and what is wrong", err)
	}
}
