// The Go side of the tests/clients drivers: the keylane Go module
// (clients/go) against keylane's own binaries.
//
//	clients-go route N < KEYS                  KEY<TAB>PARTITION per key
//	clients-go publish BOOTSTRAP TOPIC KEYS OUT  one event per key; OUT gets
//	                                           KEY<TAB>PARTITION as Kafka acknowledged it
//	clients-go same-bytes BOOTSTRAP TOPIC EVENTS PUBLISHED
//	                                           the events `keylane publish` wrote
//	                                           (PUBLISHED, its stdout, of EVENTS' JSON
//	                                           lines) encode to the same bytes in Go
//	clients-go publish-delayed BOOTSTRAP TOPIC NOT_BEFORE
//	                                           key "at" with NotBefore NOT_BEFORE (ms),
//	                                           key "in" with a Delay of 60 s
//	clients-go ledger BOOTSTRAP TOPIC PREFIX KEYS EVENTS SEED OUT
//	                                           ledger events, every 10th published
//	                                           twice with its id; OUT: the balances
//	                                           and seqs a worker must show
//	clients-go handler LOG MARKERS CRASH_AT    the handler of tests/clients/handlers.py
//	                                           on the handler package
package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/keylane/keylane/clients/go"
	"github.com/keylane/keylane/clients/go/handler"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kversion"
)

func die(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}

func lines(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		die("%v", err)
	}
	s := strings.TrimSuffix(string(b), "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func publisher(boot string) *keylane.Publisher {
	p, err := keylane.NewPublisher(boot, keylane.WithEmbeddedCluster())
	if err != nil {
		die("%v", err)
	}
	return p
}

func route(n string) {
	parts, err := strconv.Atoi(n)
	if err != nil {
		die("%v", err)
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 4096), 1<<20)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	for in.Scan() {
		fmt.Fprintf(out, "%s\t%d\n", in.Text(), keylane.Partition(in.Bytes(), int32(parts)))
	}
}

func publish(boot, topic, keysPath, out string) {
	p := publisher(boot)
	keys := lines(keysPath)
	var mu sync.Mutex
	got := map[string]keylane.Delivery{}
	var failed []string
	ctx := context.Background()
	for i, key := range keys {
		_, err := p.PublishAsync(ctx, topic, keylane.Event{Key: key, Type: "credit", Payload: map[string]int{"amount": i + 1}},
			func(d keylane.Delivery, err error) {
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					failed = append(failed, err.Error())
				}
				got[d.Key] = d
			})
		if err != nil {
			die("%v", err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		die("%v", err)
	}
	p.Close()
	if len(failed) > 0 || len(got) != len(keys) {
		die("%d of %d delivered: %v", len(got)-len(failed), len(keys), failed)
	}
	f, err := os.Create(out)
	if err != nil {
		die("%v", err)
	}
	w := bufio.NewWriter(f)
	for _, key := range keys {
		fmt.Fprintf(w, "%s\t%d\n", key, got[key].Partition)
	}
	if err := w.Flush(); err != nil {
		die("%v", err)
	}
	f.Close()
}

type jsonEvent struct {
	Key        string          `json:"key"`
	Type       string          `json:"type"`
	ID         string          `json:"id"`
	Payload    json.RawMessage `json:"payload"`
	PayloadB64 string          `json:"payload_b64"`
	Headers    json.RawMessage `json:"headers"`
	NotBefore  int64           `json:"not_before"`
}

// headersOf keeps the JSON object's order, as `keylane publish` does.
func headersOf(raw json.RawMessage) []keylane.Header {
	if raw == nil {
		return nil
	}
	d := json.NewDecoder(strings.NewReader(string(raw)))
	var h []keylane.Header
	d.Token()
	for d.More() {
		k, _ := d.Token()
		v, _ := d.Token()
		h = append(h, keylane.Header{Name: k.(string), Value: v.(string)})
	}
	return h
}

func sameBytes(boot, topic, eventsPath, publishedPath string) {
	events, published := lines(eventsPath), lines(publishedPath)
	if len(events) != len(published) {
		die("keylane publish reported %d events of %d", len(published), len(events))
	}
	var diffs []string
	for i := range events {
		var want jsonEvent
		var r struct {
			Key       string `json:"key"`
			ID        string `json:"id"`
			Partition int32  `json:"partition"`
			Offset    int64  `json:"offset"`
		}
		if err := json.Unmarshal([]byte(events[i]), &want); err != nil {
			die("%v", err)
		}
		if err := json.Unmarshal([]byte(published[i]), &r); err != nil {
			die("%v", err)
		}
		v := kversion.Stable()
		v.SetMaxKeyVersion(18, 2)
		cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(boot, ",")...), kgo.MaxVersions(v),
			kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {r.Partition: kgo.NewOffset().At(r.Offset)}}))
		if err != nil {
			die("%v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		var rec *kgo.Record
		for rec == nil && ctx.Err() == nil {
			cl.PollFetches(ctx).EachRecord(func(x *kgo.Record) {
				if rec == nil {
					rec = x
				}
			})
		}
		cancel()
		cl.Close()
		if rec == nil {
			diffs = append(diffs, want.Key+": not read back")
			continue
		}
		env, err := keylane.Decode(rec.Key, rec.Value)
		if err != nil {
			diffs = append(diffs, fmt.Sprintf("%s: %v", want.Key, err))
			continue
		}
		var payload any = []byte(nil)
		if want.PayloadB64 != "" {
			b, _ := base64.StdEncoding.DecodeString(want.PayloadB64)
			payload = b
		} else if want.Payload != nil {
			payload = want.Payload
		}
		p, err := keylane.Payload(payload)
		if err != nil {
			die("%v", err)
		}
		mine, err := keylane.CheckEvent(want.Key, &keylane.Envelope{ID: env.ID, Type: want.Type, TS: env.TS, Payload: p, Headers: headersOf(want.Headers), NotBefore: want.NotBefore})
		if err != nil {
			diffs = append(diffs, fmt.Sprintf("%s: %v", want.Key, err))
		} else if string(mine) != string(rec.Value) {
			diffs = append(diffs, fmt.Sprintf("%s: Go %x, keylane publish %x", want.Key, mine[:min(len(mine), 60)], rec.Value[:min(len(rec.Value), 60)]))
		}
		if env.NotBefore != want.NotBefore {
			diffs = append(diffs, fmt.Sprintf("%s: not before %d, given %d", want.Key, env.NotBefore, want.NotBefore))
		}
		if env.ID != r.ID {
			diffs = append(diffs, fmt.Sprintf("%s: id %s, reported %s", want.Key, env.ID, r.ID))
		}
	}
	if len(diffs) > 0 {
		die("envelopes differ: %s", strings.Join(diffs[:min(len(diffs), 5)], "; "))
	}
}

func publishDelayed(boot, topic, notBefore string) {
	ms, err := strconv.ParseInt(notBefore, 10, 64)
	if err != nil {
		die("%v", err)
	}
	p := publisher(boot)
	defer p.Close()
	for _, ev := range []keylane.Event{
		{Key: "at", Type: "later", Payload: map[string]any{"n": 1}, NotBefore: time.UnixMilli(ms)},
		{Key: "in", Type: "later", Payload: map[string]any{"n": 2}, Delay: time.Minute},
	} {
		if _, err := p.Publish(context.Background(), topic, ev); err != nil {
			die("%v", err)
		}
	}
}

func ledger(boot, topic, prefix, keys, events, seed, out string) {
	nkeys, _ := strconv.Atoi(keys)
	n, _ := strconv.Atoi(events)
	s, _ := strconv.ParseInt(seed, 10, 64)
	rnd := rand.New(rand.NewSource(s))
	p := publisher(boot)
	type entry struct {
		Balance int64 `json:"balance"`
		LastSeq int64 `json:"last_seq"`
	}
	exp := map[string]*entry{}
	ctx := context.Background()
	var mu sync.Mutex
	var failed []error
	done := func(_ keylane.Delivery, err error) {
		if err != nil {
			mu.Lock()
			failed = append(failed, err)
			mu.Unlock()
		}
	}
	for i := 0; i < n; i++ {
		key := fmt.Sprintf("%s%04d", prefix, rnd.Intn(nkeys))
		e := exp[key]
		if e == nil {
			e = &entry{}
			exp[key] = e
		}
		e.LastSeq++
		amount := int64(rnd.Intn(1000) + 1)
		kind := "credit"
		if rnd.Float64() < 0.3 {
			kind = "debit"
			e.Balance -= amount
		} else {
			e.Balance += amount
		}
		ev := keylane.Event{Key: key, Type: kind, ID: fmt.Sprintf("%s-%d", prefix, i),
			Payload: map[string]int64{"amount": amount, "seq": e.LastSeq}}
		for j := 0; j < 1+btoi(i%10 == 0); j++ { // every 10th twice, same id
			if _, err := p.PublishAsync(ctx, topic, ev, done); err != nil {
				die("%v", err)
			}
		}
	}
	if err := p.Flush(ctx); err != nil {
		die("%v", err)
	}
	p.Close()
	if len(failed) > 0 {
		die("%d not delivered: %v", len(failed), failed[0])
	}
	b, _ := json.Marshal(exp)
	if err := os.WriteFile(out, b, 0o644); err != nil {
		die("%v", err)
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// runHandler is tests/clients/handler_py.py in Go.
func runHandler(logPath, markers, crashAt string) {
	log, err := os.OpenFile(logPath, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		die("%v", err)
	}
	crash, _ := strconv.Atoi(crashAt)
	once := func(name string) bool {
		f, err := os.OpenFile(markers+"/"+name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			return false
		}
		f.Close()
		return true
	}
	effect := func(id, key string, delta int64) error {
		b, _ := json.Marshal(map[string]any{"id": id, "key": key, "delta": delta})
		_, err := log.Write(append(b, '\n'))
		return err
	}
	seen := 0
	handler.Run(func(ctx context.Context, ev *handler.Event, tx *handler.Tx) error {
		seen++
		if seen == crash && once("crash") {
			os.Exit(3) // killed mid-batch: the events in flight are retried
		}
		var p struct {
			Amount int64  `json:"amount"`
			To     string `json:"to"`
			ID     string `json:"id"`
		}
		if err := ev.Decode(&p); err != nil {
			return handler.Fail(err)
		}
		switch {
		case ev.Type == "fail":
			return handler.Failf("refused %s", ev.ID)
		case ev.Type == "retry" && once("retry-"+ev.ID):
			return errors.New("not yet " + ev.ID)
		case ev.Type == "raise" && once("raise-"+ev.ID):
			panic("a bug on the first try of " + ev.ID)
		case ev.Type == "credit" || ev.Type == "retry" || ev.Type == "raise":
			return effect(ev.ID, ev.Key, p.Amount)
		case ev.Type == "debit":
			return effect(ev.ID, ev.Key, -p.Amount)
		case ev.Type == "transfer":
			if err := effect(ev.ID, ev.Key, -p.Amount); err != nil {
				return err
			}
			return tx.Emit(p.To, "credit", map[string]any{"amount": p.Amount, "from": ev.Key})
		case ev.Type == "cancel":
			return tx.Cancel(p.ID)
		}
		return handler.Failf("unknown type %s", ev.Type)
	})
}

func main() {
	if len(os.Args) < 2 {
		die("usage: clients-go route|publish|same-bytes|publish-delayed|ledger|handler ...")
	}
	a := os.Args[2:]
	switch os.Args[1] {
	case "route":
		route(a[0])
	case "publish":
		publish(a[0], a[1], a[2], a[3])
	case "same-bytes":
		sameBytes(a[0], a[1], a[2], a[3])
	case "publish-delayed":
		publishDelayed(a[0], a[1], a[2])
	case "ledger":
		ledger(a[0], a[1], a[2], a[3], a[4], a[5], a[6])
	case "handler":
		runHandler(a[0], a[1], a[2])
	default:
		die("unknown command %s", os.Args[1])
	}
}
