package routes

import (
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// The YAML decoder's messages name Go types ("field x not found in type
// routes.RouteSpec", "cannot unmarshal !!str into float64") and, for parser
// errors, a line one too early (go-yaml v3 reports the 0-based line of the
// collection it was parsing). An operator should read the YAML section, the
// field and the line they wrote; these turn one into the other.

// sections maps the config's Go types to what the operator calls them and
// the fields they accept.
var sections = func() map[string]section {
	out := map[string]section{}
	for name, v := range map[string]any{
		"the top level": File{}, "listen": Listen{}, "admin": AdminConfig{}, "store": StoreConfig{},
		"store.memory": MemoryStore{}, "store.redis": RedisStore{}, "headers": Headers{},
		"a fleet": FleetSpec{}, "a gateway": GatewaySpec{}, "a model": ModelSpec{}, "a route": RouteSpec{},
	} {
		t := reflect.TypeOf(v)
		var fields []string
		for i := 0; i < t.NumField(); i++ {
			if tag, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); tag != "" && tag != "-" {
				fields = append(fields, tag)
			}
		}
		slices.Sort(fields)
		out["routes."+t.Name()] = section{name: name, fields: fields}
	}
	return out
}()

type section struct {
	name   string
	fields []string
}

var (
	reUnknownField = regexp.MustCompile(`^(line \d+: )field (\S+) not found in type (\S+)$`)
	reUnmarshal    = regexp.MustCompile("^(line \\d+: )cannot unmarshal (!!\\w+)(?: `(.*)`)? into (\\S+)$")
	reParserLine   = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)
)

// parserMessages are go-yaml's parser (not scanner) errors, whose line is
// reported 0-based.
var parserMessages = []string{
	"did not find expected <document start>", "did not find expected node content",
	"did not find expected key", "did not find expected '-' indicator",
	"did not find expected ',' or ']'", "did not find expected ',' or '}'",
	"found undefined tag handle", "found duplicate %YAML directive",
	"found incompatible YAML document", "found duplicate %TAG directive",
}

// friendlyYAMLError rewrites one decoder message.
func friendlyYAMLError(msg string) string {
	if m := reUnknownField.FindStringSubmatch(msg); m != nil {
		sec, ok := sections[m[3]]
		if !ok {
			return fmt.Sprintf("%sunknown field %q", m[1], m[2])
		}
		return m[1] + unknownField(m[2], sec.name, sec.fields)
	}
	if m := reUnmarshal.FindStringSubmatch(msg); m != nil {
		got := yamlKind(m[2])
		if m[3] != "" {
			got += " " + strconv.Quote(m[3])
		}
		return fmt.Sprintf("%smust be %s, got %s", m[1], goKind(m[4]), got)
	}
	if m := reParserLine.FindStringSubmatch(msg); m != nil {
		for _, p := range parserMessages {
			if strings.HasPrefix(m[2], p) {
				n, _ := strconv.Atoi(m[1])
				return fmt.Sprintf("yaml: line %d: %s", n+1, m[2])
			}
		}
	}
	return msg
}

func yamlKind(tag string) string {
	switch tag {
	case "!!seq":
		return "a list"
	case "!!map":
		return "an object"
	}
	if k := tagKind(tag); k != "a scalar" {
		return k
	}
	return strings.TrimPrefix(tag, "!!")
}

func goKind(t string) string {
	switch {
	case strings.HasPrefix(t, "[]"):
		return "a list"
	case strings.HasPrefix(t, "map["):
		return "an object"
	case t == "string":
		return "a string"
	case t == "bool":
		return "true or false"
	case strings.HasPrefix(t, "float"):
		return "a number"
	case strings.HasPrefix(t, "int"), strings.HasPrefix(t, "*int"):
		return "a whole number"
	}
	if s, ok := sections[strings.TrimPrefix(t, "*")]; ok {
		return "an object (" + s.name + ")"
	}
	return "a " + t
}

var reLine = regexp.MustCompile(`^line (\d+): `)

// withFieldPath names the field of a "line N: must be …" message: the path
// of the key whose value starts on line N (e.g. gateways[0].models[0].routes).
func withFieldPath(msg string, root *yaml.Node) string {
	m := reLine.FindStringSubmatch(msg)
	if m == nil || root == nil || strings.Contains(msg, "unknown field") {
		return msg
	}
	line, _ := strconv.Atoi(m[1])
	if path := pathAtLine(root, "", line); path != "" {
		return "line " + m[1] + ": " + path + ": " + strings.TrimPrefix(msg, m[0])
	}
	return msg
}

func pathAtLine(n *yaml.Node, path string, line int) string {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			if p := pathAtLine(c, path, line); p != "" {
				return p
			}
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			if v.Line == line && v.Kind == yaml.ScalarNode || (v.Line == line && k.Line == line) {
				if deeper := pathAtLine(v, p, line); deeper != "" && v.Kind != yaml.ScalarNode {
					return deeper
				}
				return p
			}
			if deeper := pathAtLine(v, p, line); deeper != "" {
				return deeper
			}
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			if deeper := pathAtLine(c, fmt.Sprintf("%s[%d]", path, i), line); deeper != "" {
				return deeper
			}
		}
	}
	return ""
}

// unknownField is the one spelling of an unknown key, wherever it is: the
// section, the keys it knows, and the closest one when it looks like a
// typo.
func unknownField(got, section string, known []string) string {
	return fmt.Sprintf("unknown field %q in %s (known: %s%s)", got, section, strings.Join(known, ", "), didYouMean(got, known))
}

var reParserAt = regexp.MustCompile(`^yaml: line (\d+): (did not find expected key|mapping values are not allowed in this context|did not find expected '-' indicator)`)

// pinpointIndent names the line a block-structure error really comes from.
// go-yaml reports where the enclosing block began ("line 2: did not find
// expected key") rather than the line whose indentation broke it: the first
// line indented deeper than its block's level without the line before it
// opening a block (a key with no value).
func pinpointIndent(msg string, data []byte) string {
	m := reParserAt.FindStringSubmatch(msg)
	if m == nil {
		return msg
	}
	from, _ := strconv.Atoi(m[1])
	var levels []int
	prev := ""
	for i, raw := range strings.Split(string(data), "\n") {
		line := strings.TrimRight(raw, " \t\r")
		trimmed := strings.TrimLeft(line, " ")
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		indent := len(line) - len(trimmed)
		for len(levels) > 0 && levels[len(levels)-1] > indent {
			levels = levels[:len(levels)-1]
		}
		if len(levels) > 0 && indent > levels[len(levels)-1] && !strings.HasSuffix(prev, ":") {
			if i+1 >= from {
				return fmt.Sprintf("yaml: line %d: bad indentation: indented %d spaces, which matches no enclosing block (the parser gave up at line %d: %s)",
					i+1, indent, from, m[2])
			}
		}
		if len(levels) == 0 || indent > levels[len(levels)-1] {
			levels = append(levels, indent)
		}
		// A sequence item's content is a level of its own ("- key: v").
		if strings.HasPrefix(trimmed, "- ") {
			levels = append(levels, indent+2)
		}
		prev = trimmed
	}
	return msg
}
