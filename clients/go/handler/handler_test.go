package handler

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

const req = `{"seq":7,"topic":"events","key":"acct-1","id":"id-1","type":"credit","ts":1700000000000,"partition":3,"offset":42,"epoch":5,"payload":{"amount":5}}`

func answerOf(t *testing.T, fn Func, line string) map[string]any {
	var a map[string]any
	if err := json.Unmarshal(Answer(context.Background(), fn, []byte(line)), &a); err != nil {
		t.Fatal(err)
	}
	return a
}

func TestTheEventAndItsFence(t *testing.T) {
	var got *Event
	a := answerOf(t, func(ctx context.Context, ev *Event, tx *Tx) error {
		got = ev
		if tx.Fence != (Fence{"events", 3, 5, 42}) {
			t.Errorf("fence %+v", tx.Fence)
		}
		return nil
	}, req)
	if fmt.Sprint(a) != "map[seq:7 status:ok]" {
		t.Fatal(a)
	}
	var p struct{ Amount int }
	if err := got.Decode(&p); err != nil || p.Amount != 5 || got.Key != "acct-1" || got.ID != "id-1" || got.TS != 1700000000000 {
		t.Fatal(got, err)
	}
	b64 := strings.Replace(strings.Replace(req, `"key":"acct-1"`, `"key_b64":"/w=="`, 1), `"payload":{"amount":5}`, `"payload_b64":"AAE="`, 1)
	answerOf(t, func(ctx context.Context, ev *Event, tx *Tx) error {
		got = ev
		return nil
	}, b64)
	if !bytes.Equal(got.KeyBytes, []byte{0xff}) || !bytes.Equal(got.PayloadBytes, []byte{0, 1}) || got.Payload != nil {
		t.Fatal(got)
	}
}

func TestErrorsAreTheOutcome(t *testing.T) {
	cases := []struct {
		fn     Func
		status string
		err    string
	}{
		{func(ctx context.Context, ev *Event, tx *Tx) error { return Failf("no such account") }, "fail", "no such account"},
		{func(ctx context.Context, ev *Event, tx *Tx) error { return errors.New("db busy") }, "retry", "db busy"},
		{func(ctx context.Context, ev *Event, tx *Tx) error { panic("boom") }, "retry", "panic: boom"},
		{func(ctx context.Context, ev *Event, tx *Tx) error {
			_ = tx.EmitTo("events.dlq", "k", "t", nil) // dropped, still fails
			return nil
		}, "fail", "is a dead-letter topic (*.dlq)"},
	}
	for _, c := range cases {
		a := answerOf(t, c.fn, req)
		if a["status"] != c.status || !strings.Contains(fmt.Sprint(a["error"]), c.err) || a["emit"] != nil || a["seq"] != 7.0 {
			t.Errorf("got %v, want %s %q", a, c.status, c.err)
		}
	}
}

func TestEmitsGoWithOK(t *testing.T) {
	line := Answer(context.Background(), func(ctx context.Context, ev *Event, tx *Tx) error {
		if err := tx.Emit("acct-2", "credit", map[string]any{"amount": 5, "from": ev.Key}); err != nil {
			return err
		}
		_ = tx.EmitTo("other", "acct-3", "raw", []byte{0, 0xff})
		return tx.Emit("acct-4", "empty", nil)
	}, []byte(req))
	want := `{"seq":7,"status":"ok","emit":[{"key":"acct-2","payload":{"amount":5,"from":"acct-1"},"type":"credit"},{"key":"acct-3","payload_b64":"AP8=","topic":"other","type":"raw"},{"key":"acct-4","type":"empty"}]}` + "\n"
	if string(line) != want {
		t.Fatalf("got  %s\nwant %s", line, want)
	}
	for _, bad := range []struct{ topic, key, typ, says string }{
		{"", "", "t", `"key" must be a non-empty string`},
		{"", "k", strings.Repeat("t", 256), `"type" is 256 bytes, the limit is 255`},
		{"__consumer_offsets", "k", "t", "internal to Kafka"},
		{"a b", "k", "t", "a character Kafka does not allow"},
	} {
		tx := &Tx{}
		if err := tx.EmitTo(bad.topic, bad.key, bad.typ, nil); err == nil || !strings.Contains(err.Error(), bad.says) {
			t.Errorf("%+v: %v", bad, err)
		}
	}
}

// A follow-up with a time carries "not_before" (ms); a delayed event's
// request gives its own as Event.NotBefore.
func TestDelayedEmitsAndEvents(t *testing.T) {
	at := time.UnixMilli(1767225600000)
	var got int64 = -1
	line := Answer(context.Background(), func(ctx context.Context, ev *Event, tx *Tx) error {
		got = ev.NotBefore
		if err := tx.EmitAt("", "acct-2", "release", nil, at); err != nil {
			return err
		}
		return tx.EmitAt("", "acct-3", "now", nil, time.Time{})
	}, []byte(strings.Replace(req, `"epoch":5`, `"epoch":5,"not_before":1767225600000`, 1)))
	want := `{"seq":7,"status":"ok","emit":[{"key":"acct-2","not_before":1767225600000,"type":"release"},{"key":"acct-3","type":"now"}]}` + "\n"
	if string(line) != want || got != 1767225600000 {
		t.Fatalf("got  %s (NotBefore %d)\nwant %s", line, got, want)
	}
	tx := &Tx{}
	err := tx.EmitAt("", "k", "t", nil, time.UnixMilli(-5))
	if err == nil || !strings.Contains(err.Error(), "is not after the Unix epoch") || len(tx.emits) != 0 || tx.err == nil {
		t.Errorf("a time before the epoch: %v", err)
	}
}

func TestServeAnswersPipelinedLinesInOrder(t *testing.T) {
	var in bytes.Buffer
	for i := 1; i <= 20; i++ {
		typ := "credit"
		if i%5 == 0 {
			typ = "bad"
		}
		fmt.Fprintf(&in, `{"seq":%d,"topic":"t","key":"k","id":"id-%d","type":"%s","partition":0,"offset":%d,"epoch":1}`+"\n", i, i, typ, i)
	}
	in.WriteString(`{"seq":21,"topic":` + "\n")
	var out bytes.Buffer
	err := Serve(context.Background(), &in, &out, func(ctx context.Context, ev *Event, tx *Tx) error {
		if ev.Type == "bad" {
			return Failf("refused %s", ev.ID)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 21 {
		t.Fatalf("%d answers: %s", len(lines), out.String())
	}
	for i, line := range lines[:20] {
		want := fmt.Sprintf(`{"seq":%d,"status":"ok"}`, i+1)
		if (i+1)%5 == 0 {
			want = fmt.Sprintf(`{"seq":%d,"status":"fail","error":"refused id-%d"}`, i+1, i+1)
		}
		if line != want {
			t.Errorf("got %s, want %s", line, want)
		}
	}
	if !strings.HasPrefix(lines[20], `{"seq":21,"status":"fail"`) {
		t.Error(lines[20])
	}
}

func TestCancelsGoWithOK(t *testing.T) {
	line := Answer(context.Background(), func(ctx context.Context, ev *Event, tx *Tx) error {
		if err := tx.Cancel("release-order-17"); err != nil {
			return err
		}
		return tx.Cancel("réserve")
	}, []byte(req))
	want := `{"seq":7,"status":"ok","cancel":[{"id":"release-order-17"},{"id":"réserve"}]}` + "\n"
	if string(line) != want {
		t.Fatalf("got %s want %s", line, want)
	}
	a := answerOf(t, func(ctx context.Context, ev *Event, tx *Tx) error {
		_ = tx.Cancel("t-1")
		return errors.New("db busy") // a retry cancels nothing
	}, req)
	if a["status"] != "retry" || a["cancel"] != nil {
		t.Fatal(a)
	}
}

func TestACancelKeylaneWouldRefuseFailsTheEvent(t *testing.T) {
	many := func(n int) func(tx *Tx) {
		return func(tx *Tx) {
			for i := 0; i < n; i++ {
				_ = tx.Cancel(fmt.Sprintf("t-%d", i))
			}
		}
	}
	cases := []struct {
		do  func(tx *Tx)
		err string
	}{
		{func(tx *Tx) { _ = tx.Cancel("") }, `cancel: "id" is 0 bytes; an event's id is 1 to 255 bytes`},
		{func(tx *Tx) { _ = tx.Cancel(strings.Repeat("x", 256)) }, `cancel: "id" is 256 bytes`},
		{func(tx *Tx) { _ = tx.Cancel("\xff") }, `cancel: "id" is not valid UTF-8`},
		{func(tx *Tx) { _ = tx.Cancel("a\x00b") }, `cancel: "id" holds a NUL byte`},
		{many(65), "cancel: more than 64 timers in one event"},
	}
	for _, c := range cases {
		a := answerOf(t, func(ctx context.Context, ev *Event, tx *Tx) error {
			_ = tx.Cancel("fine")
			c.do(tx) // the error dropped: the event fails anyway
			return nil
		}, req)
		if a["status"] != "fail" || !strings.HasPrefix(fmt.Sprint(a["error"]), c.err) || a["cancel"] != nil {
			t.Errorf("got %v, want fail %q", a, c.err)
		}
	}
	a := answerOf(t, func(ctx context.Context, ev *Event, tx *Tx) error {
		many(64)(tx)
		return nil
	}, req)
	if a["status"] != "ok" || len(a["cancel"].([]any)) != 64 {
		t.Fatal(a)
	}
}
