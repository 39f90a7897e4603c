// Package handler writes a keylane exec handler as one function:
//
//	func main() {
//		handler.Run(func(ctx context.Context, ev *handler.Event, tx *handler.Tx) error {
//			if ev.Type != "credit" {
//				return handler.Fail(fmt.Errorf("unknown type %q", ev.Type)) // dead letter
//			}
//			// apply it to your database, fenced by tx.Fence
//			return tx.Emit("audit", "credited", map[string]any{"from": ev.Key})
//		})
//	}
//
// run with `keylane worker ... --handler 'exec:/path/to/program'`.
//
// The function's error is the answer: nil is "ok"; an error wrapped by
// Fail is "fail" (the event goes to the dead-letter topic with the
// error's text); any other error, or a panic, is "retry" (the event runs
// again, counting against worker.max.attempts). Emits and cancels
// (Tx.Cancel, a pending timer of the event's own key) are sent with "ok"
// only. The JSON-lines protocol is handled here: the "seq" echo and
// pipelining (the worker may send up to worker.exec.window events before
// the first answer: they are read in one go and answered in one write).
// The function runs on one goroutine, one event at a time, in the order
// the worker sent them. Standard library only.
package handler

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Limits of a follow-up, as keylane's.
const (
	KeyMax   = 1024
	TypeMax  = 255
	TopicMax = 249
	// IDMax is an event id's longest, in bytes: no timer has a longer one.
	IDMax = 255
	// CancelMax is the most timers one event cancels.
	CancelMax = 64
)

// Fence is where the event is and who owns it: a resource outside keylane
// keeps the newest epoch per (topic, partition), refuses writes with an
// older one, and applies each event id once.
type Fence struct {
	Topic     string
	Partition int32
	Epoch     int64
	Offset    int64
}

// Event is one event as the worker sent it.
type Event struct {
	// Key is the entity key; KeyBytes its bytes (a key that is not UTF-8
	// arrives as key_b64: Key then holds the same bytes).
	Key      string
	KeyBytes []byte
	ID       string
	Type     string
	TS       int64
	// Payload is the payload as JSON (what a publisher packed from a map
	// or a struct is that JSON again; a msgpack bin inside it is
	// {"$base64": ...}); nil when it is not msgpack JSON can say, and
	// then PayloadBytes holds its raw bytes (empty payload: both empty).
	Payload      json.RawMessage
	PayloadBytes []byte
	Fence        Fence
	Traceparent  string // W3C trace context; "" when the event has none
	Tracestate   string
	// NotBefore is a delayed event's time, ms since the Unix epoch: it
	// runs once that time has come. 0 for an event applied when read.
	NotBefore int64
	// Request is the JSON line, for fields a newer keylane adds.
	Request json.RawMessage
}

// Decode decodes the payload's JSON into v.
func (e *Event) Decode(v any) error {
	if e.Payload == nil {
		return fmt.Errorf("the payload is %d raw bytes, not JSON", len(e.PayloadBytes))
	}
	return json.Unmarshal(e.Payload, v)
}

type request struct {
	Seq         *uint64         `json:"seq"`
	Topic       *string         `json:"topic"`
	Key         *string         `json:"key"`
	KeyB64      *string         `json:"key_b64"`
	ID          *string         `json:"id"`
	Type        *string         `json:"type"`
	TS          int64           `json:"ts"`
	Partition   *int32          `json:"partition"`
	Offset      *int64          `json:"offset"`
	Epoch       *int64          `json:"epoch"`
	Payload     json.RawMessage `json:"payload"`
	PayloadB64  *string         `json:"payload_b64"`
	Traceparent string          `json:"traceparent"`
	Tracestate  string          `json:"tracestate"`
	NotBefore   int64           `json:"not_before"`
}

type failure struct{ err error }

func (f *failure) Error() string { return f.err.Error() }
func (f *failure) Unwrap() error { return f.err }

// Fail marks err as the event's failure: the answer is "fail" and the
// event goes to the dead-letter topic with err's text.
func Fail(err error) error {
	if err == nil {
		return nil
	}
	return &failure{err}
}

// Failf is Fail(fmt.Errorf(format, args...)).
func Failf(format string, args ...any) error { return Fail(fmt.Errorf(format, args...)) }

// Tx is the event's transaction: its fence, the follow-ups it emits and
// the timers it cancels. Emits are committed with the event (keylane's
// outbox) and published after that commit, only when the answer is "ok";
// keylane derives each one's id from the event's place in the log, so a
// retried event never emits twice. Cancels commit with the event too, and
// only with "ok".
type Tx struct {
	Fence   Fence
	emits   []map[string]any
	cancels []map[string]string
	err     error
}

// Cancel cancels the pending timer of the delayed event id (the id its
// publisher gave it) of the event's own key: it never fires. The cancel
// commits with the event (kl_txn_cancel()); a timer that no longer waits
// (it ran, before this event in the key's order, or was cancelled, or
// never was) is no error. A handler cancels its own key's timers only; to
// cancel another key's, emit a follow-up to that key whose handler
// cancels it. At most CancelMax per event. An id keylane would refuse is
// an error wrapped by Fail, and it fails the event even if the error is
// dropped: nothing of the event's is then cancelled.
func (tx *Tx) Cancel(id string) error {
	var err error
	switch {
	case len(id) == 0 || len(id) > IDMax:
		err = fmt.Errorf("cancel: %q is %d bytes; an event's id is 1 to %d bytes, so no timer has it", "id", len(id), IDMax)
	case strings.IndexByte(id, 0) >= 0:
		err = fmt.Errorf("cancel: %q holds a NUL byte; an event's id is text without NUL, so no timer has it", "id")
	case !utf8.ValidString(id):
		err = fmt.Errorf("cancel: %q is not valid UTF-8: the answer carries it as JSON text", "id")
	case len(tx.cancels) >= CancelMax:
		err = fmt.Errorf("cancel: more than %d timers in one event; cancel the rest from a follow-up to the key", CancelMax)
	}
	if err != nil {
		err = Fail(err)
		if tx.err == nil {
			tx.err = err
		}
		return err
	}
	tx.cancels = append(tx.cancels, map[string]string{"id": id})
	return nil
}

// Emit adds a follow-up of key and typ to the event's own topic; see EmitTo.
func (tx *Tx) Emit(key, typ string, payload any) error { return tx.EmitTo("", key, typ, payload) }

var topicChars = regexp.MustCompile(`^[a-zA-Z0-9._-]+$`)

// EmitTo adds a follow-up event of key and typ to topic ("" for the
// event's own). payload is []byte (stored as it is), nil (an empty
// payload), or any value encoding/json writes (keylane stores its
// msgpack). A follow-up keylane would refuse is an error wrapped by Fail,
// and it fails the event even if the error is dropped: no partial emits.
func (tx *Tx) EmitTo(topic, key, typ string, payload any) error {
	return tx.emit(topic, key, typ, payload, 0, nil)
}

// EmitAt is EmitTo with a delivery time: the follow-up is published at
// once, and its worker keeps it as a timer and applies it, in its key's
// order, once notBefore has come; one more than the worker's
// timer.max.delay ahead fails the event. For a delay d, pass
// time.Now().Add(d); the zero time is none.
func (tx *Tx) EmitAt(topic, key, typ string, payload any, notBefore time.Time) error {
	var err error
	ms := notBefore.UnixMilli()
	if notBefore.IsZero() {
		ms = 0
	} else if ms <= 0 {
		err = fmt.Errorf("emit: not_before %s is not after the Unix epoch: give a later time, or the zero time for none", notBefore.Format(time.RFC3339Nano))
	}
	return tx.emit(topic, key, typ, payload, ms, err)
}

func (tx *Tx) emit(topic, key, typ string, payload any, notBefore int64, err error) error {
	item := map[string]any{}
	if err == nil {
		err = emitText("key", key, KeyMax)
	}
	if err == nil {
		err = emitText("type", typ, TypeMax)
	}
	if err == nil && topic != "" {
		err = emitTopic(topic)
		item["topic"] = topic
	}
	if err == nil {
		switch p := payload.(type) {
		case nil:
		case []byte:
			item["payload_b64"] = base64.StdEncoding.EncodeToString(p)
		default:
			var text []byte
			if text, err = json.Marshal(p); err != nil {
				err = fmt.Errorf("emit: the payload is not a JSON value (%v): pass []byte or JSON-able data", err)
			}
			item["payload"] = json.RawMessage(text)
		}
	}
	if err != nil {
		err = Fail(err)
		if tx.err == nil {
			tx.err = err
		}
		return err
	}
	item["key"], item["type"] = key, typ
	if notBefore > 0 {
		item["not_before"] = notBefore
	}
	tx.emits = append(tx.emits, item)
	return nil
}

func emitText(field, v string, limit int) error {
	switch {
	case v == "":
		return fmt.Errorf("emit: %q must be a non-empty string", field)
	case strings.IndexByte(v, 0) >= 0:
		return fmt.Errorf("emit: %q holds a NUL: it must be text without NUL", field)
	case !utf8.ValidString(v):
		return fmt.Errorf("emit: %q is not valid UTF-8: a follow-up's %s is JSON text", field, field)
	case len(v) > limit:
		return fmt.Errorf("emit: %q is %d bytes, the limit is %d", field, len(v), limit)
	}
	return nil
}

func emitTopic(t string) error {
	switch {
	case len(t) > TopicMax || t == "." || t == "..":
		return fmt.Errorf("emit: topic %q is not a Kafka topic name (1..%d of letters, digits, '.', '_', '-')", t, TopicMax)
	case !topicChars.MatchString(t):
		return fmt.Errorf("emit: topic %q has a character Kafka does not allow: letters, digits, '.', '_' and '-'", t)
	case strings.HasPrefix(t, "__"):
		return fmt.Errorf("emit: topic %q is internal to Kafka (__*): a handler may not emit to it", t)
	case strings.HasSuffix(t, ".dlq"):
		return fmt.Errorf("emit: topic %q is a dead-letter topic (*.dlq): a handler may not emit to it", t)
	}
	return nil
}

// Func handles one event; its error is the answer (see the package doc).
type Func func(ctx context.Context, ev *Event, tx *Tx) error

func decodeEvent(line []byte) (*Event, *uint64, error) {
	var r request
	if err := json.Unmarshal(line, &r); err != nil {
		return nil, nil, err
	}
	missing := ""
	switch {
	case r.Topic == nil:
		missing = "topic"
	case r.Key == nil && r.KeyB64 == nil:
		missing = "key"
	case r.ID == nil:
		missing = "id"
	case r.Type == nil:
		missing = "type"
	case r.Partition == nil || r.Offset == nil || r.Epoch == nil:
		missing = "partition, offset or epoch"
	}
	if missing != "" {
		return nil, r.Seq, fmt.Errorf("a request without its %s: %.200s", missing, line)
	}
	ev := &Event{ID: *r.ID, Type: *r.Type, TS: r.TS, Traceparent: r.Traceparent, Tracestate: r.Tracestate, NotBefore: r.NotBefore,
		Fence: Fence{*r.Topic, *r.Partition, *r.Epoch, *r.Offset}, Request: line}
	if r.Key != nil {
		ev.Key, ev.KeyBytes = *r.Key, []byte(*r.Key)
	} else {
		b, err := base64.StdEncoding.DecodeString(*r.KeyB64)
		if err != nil {
			return nil, r.Seq, fmt.Errorf("key_b64: %v", err)
		}
		ev.Key, ev.KeyBytes = string(b), b
	}
	if r.Payload != nil {
		ev.Payload = r.Payload
	} else if r.PayloadB64 != nil {
		b, err := base64.StdEncoding.DecodeString(*r.PayloadB64)
		if err != nil {
			return nil, r.Seq, fmt.Errorf("payload_b64: %v", err)
		}
		ev.PayloadBytes = b
	}
	return ev, r.Seq, nil
}

type answer struct {
	Seq    *uint64             `json:"seq,omitempty"`
	Status string              `json:"status"`
	Error  string              `json:"error,omitempty"`
	Emit   []map[string]any    `json:"emit,omitempty"`
	Cancel []map[string]string `json:"cancel,omitempty"`
}

// call runs fn, a panic turned into an error.
func call(ctx context.Context, fn Func, ev *Event, tx *Tx) (err error) {
	defer func() {
		if p := recover(); p != nil {
			fmt.Fprintf(os.Stderr, "keylane handler: panic: %v\n%s", p, debug.Stack())
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return fn(ctx, ev, tx)
}

// Answer runs fn on one request line and returns the answer line (with
// its newline). For tests of a handler without a worker.
func Answer(ctx context.Context, fn Func, line []byte) []byte {
	ev, seq, err := decodeEvent(line)
	a := answer{Seq: seq, Status: "ok"}
	if err != nil {
		a.Status, a.Error = "fail", "keylane handler: "+err.Error()
	} else {
		tx := &Tx{Fence: ev.Fence}
		err = call(ctx, fn, ev, tx)
		if err == nil {
			err = tx.err
		}
		var f *failure
		switch {
		case errors.As(err, &f):
			a.Status, a.Error = "fail", err.Error()
		case err != nil:
			a.Status, a.Error = "retry", err.Error()
		default:
			a.Emit, a.Cancel = tx.emits, tx.cancels
		}
	}
	if a.Status == "ok" && a.Emit == nil && a.Cancel == nil && seq != nil {
		return []byte(`{"seq":` + strconv.FormatUint(*seq, 10) + `,"status":"ok"}` + "\n")
	}
	out, _ := json.Marshal(a)
	return append(out, '\n')
}

var seqOnly = regexp.MustCompile(`^\s*\{\s*"seq"\s*:\s*([0-9]{1,19})\s*[,}]`)

// Serve answers the request lines of r on w until r ends (nil) or fails,
// or ctx is done between two reads. Lines that arrived together are
// answered in one write.
func Serve(ctx context.Context, r io.Reader, w io.Writer, fn Func) error {
	in := bufio.NewReaderSize(r, 1<<16)
	var out []byte
	for {
		line, err := in.ReadSlice('\n')
		if err == bufio.ErrBufferFull { // a long line: read it whole
			rest, err2 := in.ReadBytes('\n')
			line, err = append(append([]byte(nil), line...), rest...), err2
		}
		if len(bytes.TrimSpace(line)) > 0 {
			if !json.Valid(line) {
				m := seqOnly.FindSubmatch(line)
				fmt.Fprintf(os.Stderr, "keylane handler: a request line that is not JSON: %.200q\n", line)
				if m == nil {
					return errors.New("keylane handler: a request line that is not JSON and has no seq")
				}
				line = []byte(`{"seq":` + string(m[1]) + `}`)
			}
			out = append(out, Answer(ctx, fn, line)...)
		}
		if len(out) > 0 && (err != nil || in.Buffered() == 0 || len(out) > 1<<16) {
			if _, werr := w.Write(out); werr != nil {
				return werr
			}
			out = out[:0]
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// Run serves the worker on stdin and stdout until stdin closes, then
// exits the program (1 on a broken pipe). os.Stdout is stderr meanwhile,
// so that a fmt.Println cannot break the protocol.
func Run(fn Func) {
	out := os.Stdout
	os.Stdout = os.Stderr
	if err := Serve(context.Background(), os.Stdin, out, fn); err != nil {
		fmt.Fprintln(os.Stderr, "keylane handler:", err)
		os.Exit(1)
	}
	os.Exit(0)
}
