package api

import (
	"bytes"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"gopkg.in/yaml.v3"
)

// walker reads a yaml.v3 node tree and records diagnostics with positions.
// We walk nodes instead of unmarshalling into structs so that every problem
// carries its line, unknown keys get a suggestion, and all problems are
// reported at once rather than the first one only.
type walker struct {
	file  string
	diags Diagnostics
}

func (w *walker) errorf(n *yaml.Node, field, format string, args ...any) {
	w.diags = append(w.diags, Diagnostic{File: w.file, Line: line(n), Field: brief(field), Message: message(format, args)})
}

func (w *walker) warnf(n *yaml.Node, field, format string, args ...any) {
	w.diags = append(w.diags, Diagnostic{File: w.file, Line: line(n), Field: brief(field), Message: message(format, args), Severity: SeverityWarning})
}

// A string longer than maxString in a message is cut to maxQuoted bytes:
// messages of their own are shorter, values from the input may not be.
const (
	maxString = 200
	maxQuoted = 64
)

// message formats a diagnostic, quoting long values from the input briefly:
// a 50 MB scalar must not come back whole in an error.
func message(format string, args []any) string {
	for i, a := range args {
		if s, ok := a.(string); ok {
			args[i] = brief(s)
		}
	}
	return fmt.Sprintf(format, args...)
}

// brief shortens a string longer than maxString to maxQuoted bytes (on a
// rune boundary), saying how long it was.
func brief(s string) string {
	if len(s) <= maxString {
		return s
	}
	cut := maxQuoted
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes)", s[:cut], len(s))
}

func line(n *yaml.Node) int {
	if n == nil {
		return 0
	}
	return n.Line
}

// deref follows an alias to the node it names.
func deref(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && i < 8; i++ {
		n = n.Alias
	}
	return n
}

var yamlLineRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^yaml: (?:line (\d+): )?(.*)$`) })

// Limits on an input file, so that bad input costs bounded time and memory:
// networks.yaml and VM files are a few kilobytes.
const (
	// MaxFileSize is the largest file vmnetctl parses.
	MaxFileSize = 1 << 20
	// MaxNodes bounds the nodes of a document with its aliases expanded:
	// an alias is walked wherever it is used, so a few lines of nested
	// aliases ("billion laughs") would otherwise stand for billions of nodes.
	MaxNodes = 100_000
)

// parse turns data into the document's root node. An empty document gives nil.
func (w *walker) parse(data []byte) *yaml.Node {
	if len(data) > MaxFileSize {
		w.errorf(nil, "", "is %d bytes; vmnetctl reads files of at most %d bytes", len(data), MaxFileSize)
		return nil
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		msg := err.Error()
		d := Diagnostic{File: w.file, Message: "invalid YAML: " + msg}
		if m := yamlLineRe().FindStringSubmatch(msg); m != nil {
			d.Line, _ = strconv.Atoi(m[1])
			d.Message = "invalid YAML: " + m[2]
		}
		d = explainYAMLError(d, data)
		w.diags = append(w.diags, d)
		return nil
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return nil
	}
	if n := expandedSize(&doc, map[*yaml.Node]int{}); n > MaxNodes {
		w.errorf(nil, "", "has more than %d nodes with its aliases expanded; vmnetctl reads small files", MaxNodes)
		return nil
	}
	root := deref(doc.Content[0])
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return nil
	}
	return root
}

// expandedSize counts n's nodes with every alias expanded, in time linear in
// the document (each node's size is computed once), saturating above
// MaxNodes. An alias cycle counts as too large.
func expandedSize(n *yaml.Node, memo map[*yaml.Node]int) int {
	if n == nil {
		return 0
	}
	if s, ok := memo[n]; ok {
		if s < 0 {
			return MaxNodes + 1 // a cycle
		}
		return s
	}
	memo[n] = -1
	size := 1
	if n.Kind == yaml.AliasNode {
		size = expandedSize(n.Alias, memo)
	}
	for _, c := range n.Content {
		size += expandedSize(c, memo)
		if size > MaxNodes {
			break
		}
	}
	size = min(size, MaxNodes+1)
	memo[n] = size
	return size
}

// fieldFunc handles one key of a mapping; path is the dotted path of the value.
type fieldFunc func(key, val *yaml.Node, path string)

// mapping calls handle for every key of n. Keys missing from known are
// reported with a "did you mean" hint, unless lenient is set, in which case
// they are ignored (for files that belong to other tools, such as lima.yaml).
// Duplicate keys are an error.
func (w *walker) mapping(n *yaml.Node, path string, known map[string]fieldFunc, lenient bool) bool {
	n = deref(n)
	if n == nil || n.Kind != yaml.MappingNode {
		w.errorf(n, path, "must be a mapping, not %s", kindName(n))
		return false
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := deref(n.Content[i]), deref(n.Content[i+1])
		if k.Kind != yaml.ScalarNode {
			w.errorf(k, path, "keys must be plain strings")
			continue
		}
		sub := joinPath(path, k.Value)
		if prev, dup := seen[k.Value]; dup {
			w.errorf(k, sub, "defined twice (first at line %d)", prev)
			continue
		}
		seen[k.Value] = k.Line
		h, ok := known[k.Value]
		if !ok {
			if !lenient {
				w.errorf(k, sub, "unknown field%s", suggest(k.Value, keys(known)))
			}
			continue
		}
		if h != nil {
			h(k, v, sub)
		}
	}
	return true
}

func keys(m map[string]fieldFunc) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func kindName(n *yaml.Node) string {
	if n == nil {
		return "nothing"
	}
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "empty"
		}
		return fmt.Sprintf("%q", n.Value)
	}
	return "something else"
}

// field reads the value at key of the mapping f, if it has one, with read
// (w.str, w.integer...) and stores it in *dst when it is of the right kind;
// check, if not nil, reports what is wrong with the value through invalid,
// an error at it.
func field[T any](w *walker, f map[string]*yaml.Node, at func(string) string, key string,
	read func(*yaml.Node, string) (T, bool), dst *T, check func(v T, invalid func(format string, args ...any))) {
	n, ok := f[key]
	if !ok {
		return
	}
	v, ok := read(n, at(key))
	if !ok {
		return
	}
	if check != nil {
		check(v, func(format string, args ...any) { w.errorf(n, at(key), format, args...) })
	}
	*dst = v
}

// str reads a scalar as a string.
func (w *walker) str(n *yaml.Node, path string) (string, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		w.errorf(n, path, "must be a string, not %s", kindName(n))
		return "", false
	}
	return n.Value, true
}

// boolean reads true or false; YAML 1.1's yes/no/on/off are refused because
// their meaning differs between parsers.
func (w *walker) boolean(n *yaml.Node, path string) (bool, bool) {
	if n.Kind == yaml.ScalarNode {
		switch n.Value {
		case "true", "True", "TRUE":
			return true, true
		case "false", "False", "FALSE":
			return false, true
		}
	}
	w.errorf(n, path, "must be true or false, not %s", kindName(n))
	return false, false
}

// integer reads a whole number.
func (w *walker) integer(n *yaml.Node, path string) (int, bool) {
	if n.Kind == yaml.ScalarNode {
		if v, err := strconv.Atoi(n.Value); err == nil {
			return v, true
		}
	}
	w.errorf(n, path, "must be a whole number, not %s", kindName(n))
	return 0, false
}

// suggest returns ` (did you mean "x"?)` for the closest candidate, or "".
func suggest(got string, candidates []string) string {
	best, bestDist := "", 3
	for _, c := range candidates {
		if strings.EqualFold(c, got) {
			return fmt.Sprintf(" (did you mean %q?)", c)
		}
		if d := levenshtein(strings.ToLower(got), strings.ToLower(c)); d < bestDist {
			best, bestDist = c, d
		}
	}
	if best == "" {
		if len(candidates) > 0 && len(candidates) <= 12 {
			return fmt.Sprintf(" (known: %s)", strings.Join(candidates, ", "))
		}
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

func levenshtein(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}

// explainYAMLError makes a YAML parser's error d say what is wrong in the
// user's terms where the parser's words do not: a tab (YAML indents with
// spaces), bytes that are not UTF-8 (with their line, which the parser
// does not give).
func explainYAMLError(d Diagnostic, data []byte) Diagnostic {
	lines := bytes.Split(data, []byte("\n"))
	if d.Line == 0 {
		for i, l := range lines {
			if !utf8.Valid(l) {
				d.Line = i + 1
				d.Message = "invalid YAML: this line is not UTF-8 text (save the file as UTF-8)"
				return d
			}
		}
		return d
	}
	if d.Line <= len(lines) && bytes.ContainsRune(lines[d.Line-1], '\t') && strings.Contains(d.Message, "cannot start any token") {
		d.Message = "invalid YAML: a tab; YAML indents with spaces only: replace the tab with spaces"
	}
	return d
}
