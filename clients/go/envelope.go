// Package keylane publishes events to keylane, the single-writer-per-key
// work queue on Kafka: the envelope, the idempotency id and keylane's own
// partition (murmur2, as keylane's C producer and the Java client compute
// it), so a key always reaches the worker that owns it. The subpackage
// handler writes exec handlers.
//
// The envelope (keylane's include/keylane/event.h) is a msgpack map
// {v, id, t, ts, p, h?, nb?} written in that order, each field in its
// smallest msgpack form: the bytes kl_event_encode() writes for the same
// event. An event with a not-before time ("nb") is version 2, so that a
// worker too old for timers refuses it rather than apply it early; any
// other is version 1, which every keylane reads.
package keylane

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// The envelope's limits, as keylane's event.h.
const (
	// EnvelopeVersion is the highest version Decode reads; AppendEnvelope
	// writes 1, or 2 for an event with a NotBefore.
	EnvelopeVersion = 2
	KeyMax          = 1024
	IDMax           = 255
	// IDReserved begins the ids keylane derives for follow-up events
	// ("~<topic>/<partition>/<offset>/<index>"): a client id may not.
	IDReserved = '~'
	TypeMax    = 255
	// TypeReserved begins the types kept for keylane's own records: a
	// client type may not.
	TypeReserved = '~'
	// MessageMax is Kafka's default message.max.bytes.
	MessageMax = 1048588
	// RecordMax is the largest key + envelope of one record.
	RecordMax       = MessageMax - 128
	PayloadMax      = 1022 * 1024
	HeadersMax      = 64
	HeaderNameMax   = 255
	HeaderValueMax  = 4096
	Traceparent     = "traceparent"
	Tracestate      = "tracestate"
	TracestateMax   = 512
	traceparentSize = 55
)

// ErrEvent is wrapped by every error about an event that breaks a rule of
// the envelope: errors.Is(err, keylane.ErrEvent). Nothing was sent.
var ErrEvent = errors.New("keylane: invalid event")

type eventError struct{ msg string }

func (e *eventError) Error() string { return e.msg }
func (e *eventError) Unwrap() error { return ErrEvent }

func invalid(format string, args ...any) error {
	return &eventError{fmt.Sprintf(format, args...)}
}

// printable shows at most 64 bytes of s, control and non-ASCII bytes and
// '"' as '?', so a hostile value cannot garble a message.
func printable(s string) string {
	n := len(s)
	if n > 64 {
		n = 64
	}
	b := []byte(s[:n])
	for i, c := range b {
		if c < 0x20 || c >= 0x7f || c == '"' {
			b[i] = '?'
		}
	}
	if len(s) > 64 {
		return string(b) + "..."
	}
	return string(b)
}

// CheckKey checks a message key: 1..KeyMax bytes.
func CheckKey(key string) error {
	if len(key) == 0 {
		return invalid("message has no key; the entity key is required, 1..%d bytes", KeyMax)
	}
	if len(key) > KeyMax {
		return invalid("message key is %d bytes, the limit is %d", len(key), KeyMax)
	}
	return nil
}

func checkLen(field string, n, min, max int) error {
	if n < min {
		return invalid("envelope field %q is empty", field)
	}
	if n > max {
		return invalid("envelope field %q is %d bytes, the limit is %d", field, n, max)
	}
	return nil
}

// CheckID checks an idempotency id: UTF-8 text without NUL, 1..IDMax
// bytes, and (client) not beginning with IDReserved.
func CheckID(id string, client bool) error {
	if err := checkLen("id", len(id), 1, IDMax); err != nil {
		return err
	}
	for i := 0; i < len(id); {
		r, n := utf8.DecodeRuneInString(id[i:])
		if r == utf8.RuneError && n <= 1 {
			return invalid("envelope field \"id\" is not valid UTF-8 at byte %d: an id is UTF-8 text without NUL, as JSON carries it", i)
		}
		if r == 0 {
			return invalid("envelope field \"id\" holds a NUL at byte %d: an id is UTF-8 text without NUL, as JSON carries it", i)
		}
		i += n
	}
	if client && id[0] == IDReserved {
		return invalid("id \"%s\" begins with '%c', which keylane keeps for the ids it derives for follow-up events: choose an id that does not (or omit it to have one made)", printable(id), IDReserved)
	}
	return nil
}

// CheckType checks an event type: 1..TypeMax bytes.
func CheckType(typ string) error { return checkLen("t", len(typ), 1, TypeMax) }

func lowerHex(s string, nonzero bool) bool {
	any := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
		any = any || c != '0'
	}
	return !nonzero || any
}

// TraceparentValid reports whether v is a W3C traceparent keylane carries.
func TraceparentValid(v string) bool {
	if len(v) < traceparentSize || len(v) > HeaderValueMax || v[2] != '-' || v[35] != '-' || v[52] != '-' {
		return false
	}
	if !lowerHex(v[:2], false) || v[:2] == "ff" || !lowerHex(v[3:35], true) || !lowerHex(v[36:52], true) || !lowerHex(v[53:55], false) {
		return false
	}
	if v[:2] == "00" {
		return len(v) == traceparentSize
	}
	return len(v) == traceparentSize || v[traceparentSize] == '-'
}

// TracestateValid reports whether v is at most TracestateMax printable
// ASCII characters.
func TracestateValid(v string) bool {
	if len(v) > TracestateMax {
		return false
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x20 || v[i] > 0x7e {
			return false
		}
	}
	return true
}

// Header is one envelope header; an event's headers keep their order.
type Header struct{ Name, Value string }

// CheckHeaders checks headers against the limits, names given twice, and
// the trace context's form.
func CheckHeaders(h []Header) error {
	if len(h) > HeadersMax {
		return invalid("envelope field \"h\" has %d headers, the limit is %d", len(h), HeadersMax)
	}
	for i, x := range h {
		if x.Name == "" {
			return invalid("header %d has an empty name", i)
		}
		if len(x.Name) > HeaderNameMax {
			return invalid("header %d's name is %d bytes, the limit is %d", i, len(x.Name), HeaderNameMax)
		}
		if len(x.Value) > HeaderValueMax {
			return invalid("header \"%s\" value is %d bytes, the limit is %d", printable(x.Name), len(x.Value), HeaderValueMax)
		}
		for _, y := range h[:i] {
			if y.Name == x.Name {
				return invalid("header \"%s\" appears twice", printable(x.Name))
			}
		}
		if x.Name == Traceparent && !TraceparentValid(x.Value) {
			v := x.Value
			if len(v) > 80 {
				v = v[:80]
			}
			return invalid("header traceparent \"%s\" is not a W3C traceparent: send \"00-<32 lower-case hex trace id>-<16 hex parent id>-<2 hex flags>\" (ids not all zeros) or leave it out", v)
		}
		if x.Name == Tracestate && !TracestateValid(x.Value) {
			return invalid("header tracestate is %d bytes or holds a character outside printable ASCII: W3C allows at most %d printable characters; shorten it or leave it out", len(x.Value), TracestateMax)
		}
	}
	return nil
}

// ---- encoding: msgpack's forms, each the smallest that holds the value

func putBE(b []byte, format byte, v uint64, width int) []byte {
	b = append(b, format)
	for i := width - 1; i >= 0; i-- {
		b = append(b, byte(v>>(8*uint(i))))
	}
	return b
}

func putLen(b []byte, format8 byte, n int) []byte {
	switch {
	case n < 256:
		return putBE(b, format8, uint64(n), 1)
	case n < 65536:
		return putBE(b, format8+1, uint64(n), 2)
	}
	return putBE(b, format8+2, uint64(n), 4)
}

func putStr(b []byte, s string) []byte {
	if len(s) < 32 {
		b = append(b, 0xa0|byte(len(s)))
	} else {
		b = putLen(b, 0xd9, len(s))
	}
	return append(b, s...)
}

func putBin(b []byte, p []byte) []byte { return append(putLen(b, 0xc4, len(p)), p...) }

func putMap(b []byte, n int) []byte {
	if n < 16 {
		return append(b, 0x80|byte(n))
	}
	if n < 65536 {
		return putBE(b, 0xde, uint64(n), 2)
	}
	return putBE(b, 0xdf, uint64(n), 4)
}

func putArray(b []byte, n int) []byte {
	if n < 16 {
		return append(b, 0x90|byte(n))
	}
	if n < 65536 {
		return putBE(b, 0xdc, uint64(n), 2)
	}
	return putBE(b, 0xdd, uint64(n), 4)
}

func putUint(b []byte, v uint64) []byte {
	switch {
	case v < 128:
		return append(b, byte(v))
	case v < 256:
		return putBE(b, 0xcc, v, 1)
	case v < 65536:
		return putBE(b, 0xcd, v, 2)
	case v < 1<<32:
		return putBE(b, 0xce, v, 4)
	}
	return putBE(b, 0xcf, v, 8)
}

func putInt(b []byte, v int64) []byte {
	switch {
	case v >= 0:
		return putUint(b, uint64(v))
	case v >= -32:
		return append(b, byte(v))
	case v >= -128:
		return putBE(b, 0xd0, uint64(v), 1)
	case v >= -32768:
		return putBE(b, 0xd1, uint64(v), 2)
	case v >= -2147483648:
		return putBE(b, 0xd2, uint64(v), 4)
	}
	return putBE(b, 0xd3, uint64(v), 8)
}

// Envelope is one event's envelope fields.
type Envelope struct {
	ID      string
	Type    string
	TS      int64 // ms since the epoch
	Payload []byte
	Headers []Header
	// NotBefore is the time before which the event is not applied, ms since
	// the epoch ("nb", version 2); 0: applied when read.
	NotBefore int64
}

// AppendEnvelope appends the envelope of e, whose fields were checked, to
// b: the bytes kl_event_encode() writes. It checks nothing, the id
// included: check an event with CheckEvent, which refuses an id beginning
// with IDReserved (a worker dead-letters a record whose such id is no
// follow-up's, reason reserved_id).
func AppendEnvelope(b []byte, e *Envelope) []byte {
	n, version := 5, byte(1)
	if len(e.Headers) > 0 {
		n++
	}
	if e.NotBefore > 0 {
		n, version = n+1, 2
	}
	b = append(b, 0x80|byte(n), 0xa1, 'v', version, 0xa2, 'i', 'd')
	b = putStr(b, e.ID)
	b = append(b, 0xa1, 't')
	b = putStr(b, e.Type)
	b = append(b, 0xa2, 't', 's')
	b = putInt(b, e.TS)
	b = append(b, 0xa1, 'p')
	b = putBin(b, e.Payload)
	if len(e.Headers) > 0 {
		b = putMap(append(b, 0xa1, 'h'), len(e.Headers))
		for _, h := range e.Headers {
			b = putStr(putStr(b, h.Name), h.Value)
		}
	}
	if e.NotBefore > 0 {
		b = putInt(append(b, 0xa2, 'n', 'b'), e.NotBefore)
	}
	return b
}

// NotBeforeMin is 10^11 ms after the Unix epoch, 1973-03-03: a NotBefore
// below it is a time in seconds (10^11 s is the year 5138), never one
// meant in milliseconds.
const NotBeforeMin = 100000000000

// duration writes ms as keylane's C library writes a duration
// (common/units.c): in the largest unit that divides it.
func duration(ms int64) string {
	for _, u := range []struct {
		name string
		mul  int64
	}{{"d", 86400000}, {"h", 3600000}, {"m", 60000}, {"s", 1000}, {"ms", 1}} {
		if ms > 0 && ms%u.mul == 0 {
			return fmt.Sprintf("%d%s", ms/u.mul, u.name)
		}
	}
	if ms == 0 {
		return "0"
	}
	return fmt.Sprintf("%dms", ms)
}

// CheckNotBefore is the rule kl_publish() keeps on a delayed event's
// time, word for word (event/envelope.h, kl__not_before_publish_check()):
// notBefore (ms since the Unix epoch; 0 is none) is refused when it is
// below NotBeforeMin (a time in seconds), more than max ms
// (timer.max.delay) before now or more than max after it; both bounds
// inclusive, max 0 bounds neither side. The error wraps ErrEvent.
func CheckNotBefore(notBefore, now, max int64) error {
	nb := notBefore
	if nb > 0 && nb < NotBeforeMin/1000 {
		return invalid("not_before %d is a time before 1973 in milliseconds since the Unix epoch, and in seconds too; give milliseconds since the Unix epoch, or a delay", nb)
	}
	if nb > 0 && nb < NotBeforeMin {
		return invalid("not_before %d is a time before 1973 in milliseconds since the Unix epoch: it looks like seconds; give milliseconds since the Unix epoch (%d if it is seconds), or a delay", nb, nb*1000)
	}
	if nb <= 0 || max <= 0 {
		return nil
	}
	if nb < now-max {
		return invalid("not_before %d is %d ms in the past, %s more than timer.max.delay (%s) allows: give milliseconds since the Unix epoch of a time at most timer.max.delay ago (a past time runs at once), or omit not_before to have the event applied when it is read",
			nb, now-nb, duration(now-nb-max), duration(max))
	}
	if nb-now > max {
		return invalid("not_before %d is %d ms from now, %s more than timer.max.delay (%s) allows: publish the event closer to its time, or raise timer.max.delay (at most store.dedup.retention)",
			nb, nb-now, duration(nb-now-max), duration(max))
	}
	return nil
}

// CheckEvent checks an event as kl_publish() does (the id and the type as
// a client's: not reserved) and returns its envelope's bytes.
func CheckEvent(key string, e *Envelope) ([]byte, error) {
	if err := CheckKey(key); err != nil {
		return nil, err
	}
	if err := CheckID(e.ID, true); err != nil {
		return nil, err
	}
	if err := CheckType(e.Type); err != nil {
		return nil, err
	}
	if e.Type[0] == TypeReserved {
		return nil, invalid("type \"%s\" begins with '%c', which keylane keeps for its own records: choose a type that does not", printable(e.Type), TypeReserved)
	}
	if e.NotBefore < 0 {
		return nil, invalid("not_before is %d: give ms since the Unix epoch, or 0 to have the event applied when it is read", e.NotBefore)
	}
	if err := checkLen("p", len(e.Payload), 0, PayloadMax); err != nil {
		return nil, err
	}
	if err := CheckHeaders(e.Headers); err != nil {
		return nil, err
	}
	value := AppendEnvelope(make([]byte, 0, 64+len(e.ID)+len(e.Type)+len(e.Payload)), e)
	if size := len(key) + len(value); size > RecordMax {
		return nil, invalid("event is %d bytes as a Kafka record (key %d + envelope %d), over the %d one record may carry (Kafka's default message.max.bytes, %d, less the batch framing): make the payload (%d bytes) or the headers smaller",
			size, len(key), len(value), RecordMax, MessageMax, len(e.Payload))
	}
	return value, nil
}

// ---- decoding

type reader struct {
	b   []byte
	off int
}

func (r *reader) need(n int, where string) error {
	if len(r.b)-r.off < n {
		return invalid("envelope is truncated in %s at byte %d: it needs %d bytes, %d are left", where, r.off, n, len(r.b)-r.off)
	}
	return nil
}

func (r *reader) be(n int, where string) (uint64, error) {
	if err := r.need(n, where); err != nil {
		return 0, err
	}
	var v uint64
	for i := 0; i < n; i++ {
		v = v<<8 | uint64(r.b[r.off+i])
	}
	r.off += n
	return v, nil
}

// item reads one msgpack item's header: its kind ('s' str, 'b' bin, 'm'
// map, 'i' int, 'u' uint, 'x' other) and its length or value.
func (r *reader) item(where string) (kind byte, n uint64, err error) {
	if err = r.need(1, where); err != nil {
		return
	}
	c := r.b[r.off]
	r.off++
	switch {
	case c <= 0x7f:
		return 'u', uint64(c), nil
	case c >= 0xe0:
		return 'i', uint64(int64(int8(c))), nil
	case c&0xe0 == 0xa0:
		return 's', uint64(c & 0x1f), nil
	case c&0xf0 == 0x80:
		return 'm', uint64(c & 0x0f), nil
	}
	widths := map[byte]struct {
		kind  byte
		width int
	}{0xd9: {'s', 1}, 0xda: {'s', 2}, 0xdb: {'s', 4}, 0xc4: {'b', 1}, 0xc5: {'b', 2}, 0xc6: {'b', 4},
		0xde: {'m', 2}, 0xdf: {'m', 4}, 0xcc: {'u', 1}, 0xcd: {'u', 2}, 0xce: {'u', 4}, 0xcf: {'u', 8},
		0xd0: {'i', 1}, 0xd1: {'i', 2}, 0xd2: {'i', 4}, 0xd3: {'i', 8}}
	w, ok := widths[c]
	if !ok {
		return 'x', 0, nil
	}
	n, err = r.be(w.width, where)
	if w.kind == 'i' {
		shift := uint(64 - 8*w.width)
		n = uint64(int64(n<<shift) >> shift)
	}
	return w.kind, n, err
}

func (r *reader) bytes(n uint64, where string) (string, error) {
	if n > uint64(len(r.b)-r.off) {
		return "", invalid("envelope is truncated in %s at byte %d: it needs %d bytes, %d are left", where, r.off, n, len(r.b)-r.off)
	}
	s := string(r.b[r.off : r.off+int(n)])
	r.off += int(n)
	return s, nil
}

var kindNames = map[byte]string{'s': "str", 'b': "bin", 'm': "map", 'i': "int", 'u': "int", 'x': "value of another type"}

// Decode decodes a Kafka message into its envelope, checking every field
// as keylane's worker does (unknown or repeated fields, types, limits).
func Decode(key, value []byte) (*Envelope, error) {
	if err := CheckKey(string(key)); err != nil {
		return nil, err
	}
	if len(value) == 0 {
		return nil, invalid("message value is empty: no envelope (a tombstone?)")
	}
	r := &reader{b: value}
	kind, n, err := r.item("the envelope's first item")
	if err != nil {
		return nil, err
	}
	if kind != 'm' {
		return nil, invalid("envelope is a msgpack %s, it must be a map", kindNames[kind])
	}
	e := &Envelope{}
	seen := map[string]bool{}
	var version uint64
	for i := uint64(0); i < n; i++ {
		k, ln, err := r.item("a field name")
		if err != nil {
			return nil, err
		}
		if k != 's' {
			return nil, invalid("envelope field names must be str, found a msgpack %s", kindNames[k])
		}
		name, err := r.bytes(ln, "a field name")
		if err != nil {
			return nil, err
		}
		if !strings.Contains(" v id t ts p h nb ", " "+name+" ") {
			return nil, invalid("envelope has a field \"%s\" that version %d does not define (v, id, t, ts, p, h, nb)", printable(name), EnvelopeVersion)
		}
		if seen[name] {
			return nil, invalid("envelope field %q appears twice", name)
		}
		seen[name] = true
		where := "field \"" + name + "\""
		vk, vn, err := r.item(where)
		if err != nil {
			return nil, err
		}
		want := map[string]byte{"v": 'u', "id": 's', "t": 's', "ts": 'i', "p": 'b', "h": 'm', "nb": 'i'}[name]
		if vk != want && !(want == 'i' && vk == 'u') {
			return nil, invalid("envelope field %q is a msgpack %s, it must be a %s", name, kindNames[vk], kindNames[want])
		}
		switch name {
		case "v":
			if vn < 1 || vn > EnvelopeVersion {
				return nil, invalid("envelope version \"v\" is %d, this build reads versions 1 to %d", vn, EnvelopeVersion)
			}
			version = vn
		case "nb":
			if vk == 'i' && int64(vn) <= 0 || vn == 0 {
				return nil, invalid("envelope field \"nb\" is %d, it must be a positive int (ms since the epoch)", int64(vn))
			}
			if vk == 'u' && vn > 1<<63-1 {
				return nil, invalid("envelope field \"nb\" is %d, the limit is %d", vn, int64(1<<63-1))
			}
			e.NotBefore = int64(vn)
		case "id":
			if e.ID, err = r.bytes(vn, where); err == nil {
				err = CheckID(e.ID, false)
			}
		case "t":
			if e.Type, err = r.bytes(vn, where); err == nil {
				err = CheckType(e.Type)
			}
		case "ts":
			if vk == 'u' && vn > 1<<63-1 {
				err = invalid("envelope field \"ts\" is %d, the limit is %d", vn, int64(1<<63-1))
			}
			e.TS = int64(vn)
		case "p":
			var p string
			if p, err = r.bytes(vn, where); err == nil {
				e.Payload = []byte(p)
				err = checkLen("p", len(p), 0, PayloadMax)
			}
		case "h":
			e.Headers, err = r.headers(vn)
		}
		if err != nil {
			return nil, err
		}
	}
	if r.off != len(value) {
		return nil, invalid("envelope ends at byte %d of %d; trailing bytes: %d", r.off, len(value), len(value)-r.off)
	}
	for _, f := range []string{"v", "id", "t", "ts", "p"} {
		if !seen[f] {
			return nil, invalid("envelope lacks the required field %q", f)
		}
	}
	// A version 1 producer cannot mean "not before": the field is not its.
	if seen["nb"] && version < 2 {
		return nil, invalid("envelope has the field \"nb\" (not before) but version %d, which lacks it: a delayed event is version 2", version)
	}
	return e, nil
}

func (r *reader) headers(n uint64) ([]Header, error) {
	if n > HeadersMax {
		return nil, invalid("envelope field \"h\" has %d headers, the limit is %d", n, HeadersMax)
	}
	h := make([]Header, 0, n)
	for i := uint64(0); i < n; i++ {
		var pair [2]string
		for j, where := range []string{"header name", "header value"} {
			k, ln, err := r.item(where)
			if err != nil {
				return nil, err
			}
			if k != 's' {
				return nil, invalid("envelope field \"h\" holds a msgpack %s as a %s, it must be a str", kindNames[k], where)
			}
			if pair[j], err = r.bytes(ln, where); err != nil {
				return nil, err
			}
		}
		h = append(h, Header{pair[0], pair[1]})
	}
	// the decoder checks the limits, not the trace context's form
	for i, x := range h {
		if x.Name == "" || len(x.Name) > HeaderNameMax || len(x.Value) > HeaderValueMax {
			return nil, CheckHeaders([]Header{x})
		}
		for _, y := range h[:i] {
			if y.Name == x.Name {
				return nil, invalid("header \"%s\" appears twice", printable(x.Name))
			}
		}
	}
	return h, nil
}
