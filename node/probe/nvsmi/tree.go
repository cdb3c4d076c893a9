package nvsmi

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Why not encoding/xml: unmarshalling an 8-GPU document into structs took
// about 2.2 ms on a 2 GHz core, most of it in reflection and per-token
// allocations; this reader builds the element tree in about a tenth of that.
// It checks what matters for trusting the result (tags nest and match, the
// input is UTF-8, entities are valid) and reads what nvidia-smi writes:
// elements, attributes, text with the predefined and numeric entities,
// CDATA, comments, processing instructions and a DOCTYPE (skipped).

// document is the element tree, held as a flat slice of nodes linked by
// index. Names and text are substrings of the input, so building it
// allocates little beyond the slice itself.
type document struct {
	nodes []node
}

type node struct {
	name  string
	text  string // character data directly inside the element, untrimmed
	id    string // the id attribute (<gpu id="00000000:19:00.0">)
	first int32  // first child, -1 when none
	last  int32  // last child, -1 when none
	next  int32  // next sibling, -1 when none
}

const none = -1

var errSyntax = errors.New("syntax error")

// parseTree reads the first element of src and everything in it; what
// follows the root element is ignored.
func parseTree(src string) (*document, error) {
	if !utf8.ValidString(src) {
		return nil, fmt.Errorf("%w: invalid UTF-8", errSyntax)
	}
	// nvidia-smi writes an element per 45 to 60 bytes.
	d := &document{nodes: make([]node, 0, len(src)/40+16)}
	s := scanner{src: src}
	var stack []int32
	for s.pos < len(src) {
		if src[s.pos] != '<' {
			text, err := s.text()
			if err != nil {
				return nil, err
			}
			if len(stack) > 0 {
				d.addText(stack[len(stack)-1], text)
			}
			continue
		}
		rest := src[s.pos:]
		switch {
		case strings.HasPrefix(rest, "<?"):
			if err := s.skipPast("?>"); err != nil {
				return nil, err
			}
		case strings.HasPrefix(rest, "<!--"):
			if err := s.skipPast("-->"); err != nil {
				return nil, err
			}
		case strings.HasPrefix(rest, "<![CDATA["):
			start := s.pos + len("<![CDATA[")
			end := strings.Index(src[start:], "]]>")
			if end < 0 {
				return nil, s.fail("unterminated CDATA section")
			}
			s.pos = start + end + len("]]>")
			if len(stack) > 0 {
				d.addText(stack[len(stack)-1], src[start:start+end])
			}
		case strings.HasPrefix(rest, "<!"):
			if err := s.skipDirective(); err != nil {
				return nil, err
			}
		case strings.HasPrefix(rest, "</"):
			name, err := s.endTag()
			if err != nil {
				return nil, err
			}
			if len(stack) == 0 {
				return nil, s.fail("unexpected end tag </" + name + ">")
			}
			top := stack[len(stack)-1]
			if d.nodes[top].name != name {
				return nil, s.fail("element <" + d.nodes[top].name + "> closed by </" + name + ">")
			}
			stack = stack[:len(stack)-1]
			if len(stack) == 0 {
				return d, nil
			}
		default:
			name, id, selfClosing, err := s.startTag()
			if err != nil {
				return nil, err
			}
			idx := d.add(name, id, stack)
			if selfClosing {
				if len(stack) == 0 {
					return d, nil
				}
			} else {
				stack = append(stack, idx)
			}
		}
	}
	if len(stack) > 0 {
		return nil, s.fail("unexpected EOF inside <" + d.nodes[stack[len(stack)-1]].name + ">")
	}
	return nil, fmt.Errorf("%w: no element found", errSyntax)
}

func (d *document) add(name, id string, stack []int32) int32 {
	idx := int32(len(d.nodes))
	d.nodes = append(d.nodes, node{name: name, id: id, first: none, last: none, next: none})
	if len(stack) > 0 {
		p := &d.nodes[stack[len(stack)-1]]
		if p.last == none {
			p.first = idx
		} else {
			d.nodes[p.last].next = idx
		}
		p.last = idx
	}
	return idx
}

// addText keeps an element's character data. Indentation between child
// elements is dropped rather than concatenated: every value is trimmed.
func (d *document) addText(n int32, text string) {
	if strings.TrimSpace(text) == "" {
		if d.nodes[n].text == "" {
			d.nodes[n].text = text
		}
		return
	}
	if strings.TrimSpace(d.nodes[n].text) == "" {
		d.nodes[n].text = text
		return
	}
	d.nodes[n].text += text
}

// child returns the first child of n named name.
func (d *document) child(n int32, name string) int32 {
	if n == none {
		return none
	}
	for c := d.nodes[n].first; c != none; c = d.nodes[c].next {
		if d.nodes[c].name == name {
			return c
		}
	}
	return none
}

// find follows a slash-separated path of child names from n.
func (d *document) find(n int32, path string) int32 {
	for n != none && path != "" {
		seg := path
		if i := strings.IndexByte(path, '/'); i >= 0 {
			seg, path = path[:i], path[i+1:]
		} else {
			path = ""
		}
		n = d.child(n, seg)
	}
	return n
}

// get returns the text at path below n, "" when the element is absent.
func (d *document) get(n int32, path string) string {
	if c := d.find(n, path); c != none {
		return d.nodes[c].text
	}
	return ""
}

// scanner walks the input for parseTree.
type scanner struct {
	src string
	pos int
}

func (s *scanner) fail(what string) error {
	return fmt.Errorf("%w at byte %d: %s", errSyntax, s.pos, what)
}

func (s *scanner) skipPast(marker string) error {
	i := strings.Index(s.src[s.pos:], marker)
	if i < 0 {
		return s.fail("missing " + marker)
	}
	s.pos += i + len(marker)
	return nil
}

// skipDirective passes over <!DOCTYPE ...>, which may hold quoted strings
// and an internal subset in brackets.
func (s *scanner) skipDirective() error {
	depth := 0
	var quote byte
	for i := s.pos + 2; i < len(s.src); i++ {
		c := s.src[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '"' || c == '\'':
			quote = c
		case c == '[':
			depth++
		case c == ']':
			depth--
		case c == '>' && depth <= 0:
			s.pos = i + 1
			return nil
		}
	}
	return s.fail("unterminated directive")
}

func (s *scanner) text() (string, error) {
	start := s.pos
	end := strings.IndexByte(s.src[start:], '<')
	if end < 0 {
		end = len(s.src)
	} else {
		end += start
	}
	s.pos = end
	raw := s.src[start:end]
	if strings.IndexByte(raw, '&') < 0 {
		return raw, nil
	}
	out, err := unescape(raw)
	if err != nil {
		return "", fmt.Errorf("%w at byte %d: %v", errSyntax, start, err)
	}
	return out, nil
}

func (s *scanner) endTag() (string, error) {
	s.pos += 2
	name, err := s.name()
	if err != nil {
		return "", err
	}
	s.skipSpace()
	if s.pos >= len(s.src) || s.src[s.pos] != '>' {
		return "", s.fail("expected > after </" + name)
	}
	s.pos++
	return name, nil
}

// startTag reads "<name attr='v'...>" or "<name/>" and keeps the id attribute.
func (s *scanner) startTag() (name, id string, selfClosing bool, err error) {
	s.pos++
	if name, err = s.name(); err != nil {
		return "", "", false, err
	}
	for {
		spaced := s.skipSpace()
		if s.pos >= len(s.src) {
			return "", "", false, s.fail("unexpected EOF in <" + name + ">")
		}
		switch s.src[s.pos] {
		case '>':
			s.pos++
			return name, id, false, nil
		case '/':
			if s.pos+1 >= len(s.src) || s.src[s.pos+1] != '>' {
				return "", "", false, s.fail("expected /> in <" + name + ">")
			}
			s.pos += 2
			return name, id, true, nil
		}
		if !spaced {
			return "", "", false, s.fail("expected space before attribute in <" + name + ">")
		}
		attr, val, err := s.attr()
		if err != nil {
			return "", "", false, err
		}
		if attr == "id" {
			id = val
		}
	}
}

func (s *scanner) attr() (name, val string, err error) {
	if name, err = s.name(); err != nil {
		return "", "", err
	}
	s.skipSpace()
	if s.pos >= len(s.src) || s.src[s.pos] != '=' {
		return "", "", s.fail("expected = after attribute " + name)
	}
	s.pos++
	s.skipSpace()
	if s.pos >= len(s.src) || (s.src[s.pos] != '"' && s.src[s.pos] != '\'') {
		return "", "", s.fail("expected quoted value for attribute " + name)
	}
	q := s.src[s.pos]
	s.pos++
	end := strings.IndexByte(s.src[s.pos:], q)
	if end < 0 {
		return "", "", s.fail("unterminated value of attribute " + name)
	}
	val = s.src[s.pos : s.pos+end]
	s.pos += end + 1
	if strings.IndexByte(val, '<') >= 0 {
		return "", "", s.fail("< in value of attribute " + name)
	}
	if strings.IndexByte(val, '&') >= 0 {
		if val, err = unescape(val); err != nil {
			return "", "", s.fail(err.Error())
		}
	}
	return name, val, nil
}

func (s *scanner) name() (string, error) {
	start := s.pos
	for s.pos < len(s.src) {
		c := s.src[s.pos]
		if c == '>' || c == '/' || c == '=' || c == '<' || c == '"' || c == '\'' || c == '&' || isSpace(c) {
			break
		}
		s.pos++
	}
	name := s.src[start:s.pos]
	if name == "" {
		return "", s.fail("expected a name")
	}
	if c := name[0]; c == '-' || c == '.' || (c >= '0' && c <= '9') {
		return "", s.fail("invalid name " + strconv.Quote(name))
	}
	return name, nil
}

func (s *scanner) skipSpace() bool {
	start := s.pos
	for s.pos < len(s.src) && isSpace(s.src[s.pos]) {
		s.pos++
	}
	return s.pos > start
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// unescape resolves the predefined and numeric character references.
func unescape(raw string) (string, error) {
	var out strings.Builder
	out.Grow(len(raw))
	for raw != "" {
		i := strings.IndexByte(raw, '&')
		if i < 0 {
			out.WriteString(raw)
			break
		}
		out.WriteString(raw[:i])
		raw = raw[i+1:]
		semi := strings.IndexByte(raw, ';')
		if semi < 0 || semi > 10 {
			return "", errors.New("unterminated entity")
		}
		ent := raw[:semi]
		raw = raw[semi+1:]
		switch ent {
		case "lt":
			out.WriteByte('<')
		case "gt":
			out.WriteByte('>')
		case "amp":
			out.WriteByte('&')
		case "apos":
			out.WriteByte('\'')
		case "quot":
			out.WriteByte('"')
		default:
			r, ok := charRef(ent)
			if !ok {
				return "", fmt.Errorf("invalid entity &%s;", ent)
			}
			out.WriteRune(r)
		}
	}
	return out.String(), nil
}

func charRef(ent string) (rune, bool) {
	if len(ent) < 2 || ent[0] != '#' {
		return 0, false
	}
	base, digits := 10, ent[1:]
	if digits[0] == 'x' {
		base, digits = 16, digits[1:]
	}
	n, err := strconv.ParseUint(digits, base, 32)
	if err != nil || n == 0 || n > utf8.MaxRune || (n >= 0xd800 && n <= 0xdfff) {
		return 0, false
	}
	return rune(n), true
}
