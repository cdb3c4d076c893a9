package membership

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"

	"github.com/hashicorp/memberlist"
)

// Roles a member declares in its Meta.
const (
	RoleAgent       = "agent"
	RoleCoordinator = "coordinator"
)

// MaxMetaSize is the most bytes an encoded Meta may take: memberlist carries
// node meta in every alive message and refuses more than this.
const MaxMetaSize = memberlist.MetaMaxSize

// metaFormat is the first byte of an encoded Meta. Later formats may only
// append fields, so an older member can still read the fields it knows.
const metaFormat byte = 1

// Errors callers can test with errors.Is.
var (
	ErrMetaTooLarge = errors.New("membership: node meta too large")
	ErrInvalidMeta  = errors.New("membership: invalid node meta")
)

// Meta is the small description every member gossips about itself.
type Meta struct {
	Role            string            // RoleAgent or RoleCoordinator
	Labels          map[string]string // the labels node selectors match on
	AgentVersion    string
	ProtocolVersion string
}

// Validate checks what a member may declare: a known role and non-empty label
// keys. It does not check the size; Encode does.
func (m Meta) Validate() error {
	switch m.Role {
	case RoleAgent, RoleCoordinator:
	default:
		return fmt.Errorf("%w: role %q is not %q or %q", ErrInvalidMeta, m.Role, RoleAgent, RoleCoordinator)
	}
	for k := range m.Labels {
		if k == "" {
			return fmt.Errorf("%w: empty label key", ErrInvalidMeta)
		}
	}
	return nil
}

// metaFlags are bits the Pool itself gossips next to the Meta.
type metaFlags uint64

// flagLeaving is set in the last alive message a member sends before it
// leaves on purpose. memberlist tells peers "left" and "failed" apart
// internally but reports both as the same leave event, so the flag is how a
// peer knows which one it saw.
const flagLeaving metaFlags = 1 << 0

// Encode packs the meta as length-prefixed strings with labels sorted by key.
// The order is fixed so that an unchanged Meta encodes to the same bytes:
// memberlist reports a node as updated whenever its meta bytes differ.
func (m Meta) Encode() ([]byte, error) {
	return m.encode(0)
}

func (m Meta) encode(flags metaFlags) ([]byte, error) {
	keys := make([]string, 0, len(m.Labels))
	for k := range m.Labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)

	buf := []byte{metaFormat}
	buf = appendString(buf, m.Role)
	buf = appendString(buf, m.AgentVersion)
	buf = appendString(buf, m.ProtocolVersion)
	buf = binary.AppendUvarint(buf, uint64(len(keys)))
	for _, k := range keys {
		buf = appendString(buf, k)
		buf = appendString(buf, m.Labels[k])
	}
	buf = binary.AppendUvarint(buf, uint64(flags))
	if len(buf) > MaxMetaSize {
		return nil, fmt.Errorf("%w: %d bytes encoded (%d labels), limit %d: shorten or drop labels",
			ErrMetaTooLarge, len(buf), len(keys), MaxMetaSize)
	}
	return buf, nil
}

func appendString(buf []byte, s string) []byte {
	buf = binary.AppendUvarint(buf, uint64(len(s)))
	return append(buf, s...)
}

// DecodeMeta reads what Encode wrote. Bytes after the fields this version
// knows are ignored so that members of a newer release can add fields.
func DecodeMeta(b []byte) (Meta, error) {
	m, _, err := decodeMeta(b)
	return m, err
}

func decodeMeta(b []byte) (Meta, metaFlags, error) {
	if len(b) == 0 {
		return Meta{}, 0, fmt.Errorf("%w: empty", ErrInvalidMeta)
	}
	if b[0] < metaFormat {
		return Meta{}, 0, fmt.Errorf("%w: format %d", ErrInvalidMeta, b[0])
	}
	d := metaDecoder{buf: b[1:]}
	var m Meta
	m.Role = d.string("role")
	m.AgentVersion = d.string("agent_version")
	m.ProtocolVersion = d.string("protocol_version")
	n := d.uvarint("label count")
	// Each label takes at least two bytes, so a larger count is corrupt; the
	// check also keeps a hostile count from sizing a huge map.
	if d.err == nil && n > uint64(len(d.buf))/2 {
		d.err = fmt.Errorf("%w: %d labels in %d bytes", ErrInvalidMeta, n, len(d.buf))
	}
	if d.err == nil && n > 0 {
		m.Labels = make(map[string]string, n)
		for i := uint64(0); i < n && d.err == nil; i++ {
			k := d.string("label key")
			m.Labels[k] = d.string("label value")
		}
	}
	flags := metaFlags(d.uvarint("flags"))
	if d.err != nil {
		return Meta{}, 0, d.err
	}
	return m, flags, nil
}

type metaDecoder struct {
	buf []byte
	err error
}

func (d *metaDecoder) uvarint(field string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.buf)
	if n <= 0 {
		d.err = fmt.Errorf("%w: truncated %s", ErrInvalidMeta, field)
		return 0
	}
	d.buf = d.buf[n:]
	return v
}

func (d *metaDecoder) string(field string) string {
	n := d.uvarint(field)
	if d.err != nil {
		return ""
	}
	if n > uint64(len(d.buf)) {
		d.err = fmt.Errorf("%w: %s length %d exceeds the %d bytes left", ErrInvalidMeta, field, n, len(d.buf))
		return ""
	}
	s := string(d.buf[:n])
	d.buf = d.buf[n:]
	return s
}
