package keylane

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kversion"
)

// embedded starts `keylane broker --embedded` (KEYLANE_BIN) with topic
// "events" of 6 partitions and returns its bootstrap.
func embedded(t *testing.T) string {
	bin := os.Getenv("KEYLANE_BIN")
	if bin == "" {
		t.Skip("KEYLANE_BIN is not set: the publisher's tests need `keylane broker --embedded`")
	}
	cmd := exec.Command(bin, "broker", "--embedded", "-t", "events", "--partitions", "6", "--brokers", "1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "bootstrap=") {
		t.Fatalf("keylane broker --embedded said %q (%v)", line, err)
	}
	return strings.TrimSpace(strings.TrimPrefix(line, "bootstrap="))
}

func TestRefusedClients(t *testing.T) {
	if _, err := NewPublisher(""); err == nil || !strings.Contains(err.Error(), "no bootstrap servers") {
		t.Error(err)
	}
	_, err := NewPublisher("127.0.0.1:1", WithKgoOpts(kgo.DisableIdempotentWrite()))
	if err == nil || !strings.Contains(err.Error(), "keylane needs the idempotent producer") {
		t.Error(err)
	}
	_, err = NewPublisher("127.0.0.1:1", WithKgoOpts(kgo.RequiredAcks(kgo.LeaderAck()), kgo.DisableIdempotentWrite()))
	if err == nil {
		t.Error("acks=1 was taken")
	}
}

func TestPublishRoutesAsKeylaneAndReportsDeliveries(t *testing.T) {
	boot := embedded(t)
	// A partitioner option is overridden: keylane sets every partition.
	p, err := NewPublisher(boot, WithEmbeddedCluster(), WithKgoOpts(kgo.RecordPartitioner(kgo.RoundRobinPartitioner())))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	d, err := p.Publish(ctx, "events", Event{Key: "acct-1", Type: "credit", Payload: map[string]int{"amount": 5}})
	if err != nil || d.Offset < 0 || len(d.ID) != 36 || d.Partition != Partition([]byte("acct-1"), 6) {
		t.Fatal(d, err)
	}
	var mu sync.Mutex
	got := map[string]Delivery{}
	for i := 0; i < 300; i++ {
		key := "k-" + string(rune('a'+i%26)) + strings.Repeat("x", i%7) + string(rune('0'+i%10))
		_, err := p.PublishAsync(ctx, "events", Event{Key: key, Type: "t", ID: key + "-id"}, func(d Delivery, err error) {
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			got[d.ID] = d
			mu.Unlock()
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for id, d := range got {
		if d.Partition != Partition([]byte(d.Key), 6) || id != d.Key+"-id" {
			t.Fatalf("%+v: not on keylane's partition", d)
		}
	}
	if n, _ := p.Partitions(ctx, "events"); n != 6 {
		t.Fatal(n)
	}
}

// NotBefore or Delay reach the envelope ("nb", version 2); both, a
// reserved type, a negative Delay, or a time beyond timer.max.delay
// (CheckNotBefore) are refused before anything is sent.
func TestDelayedEvents(t *testing.T) {
	boot, p := embeddedPublisher(t)
	ctx := context.Background()
	at := time.Now().Add(24 * time.Hour).Truncate(time.Millisecond)
	week := TimerMaxDelay
	refusals := map[string]Event{
		"both NotBefore and Delay are given":               {Key: "k", Type: "t", NotBefore: at, Delay: time.Minute},
		"Delay is -1s, before now":                         {Key: "k", Type: "t", Delay: -time.Second},
		"is not after the Unix epoch":                      {Key: "k", Type: "t", NotBefore: time.Unix(-5, 0)},
		"begins with '~', which keylane keeps for its own": {Key: "k", Type: "~timer", NotBefore: at},
		"ms from now, ":                                    {Key: "k", Type: "t", Delay: week + time.Hour},
		"ms in the past, ":                                 {Key: "k", Type: "t", NotBefore: time.Now().Add(-week - time.Hour)},
		"(1767225600000 if it is seconds)":                 {Key: "k", Type: "t", NotBefore: time.UnixMilli(1767225600)},
	}
	for says, ev := range refusals {
		if _, err := p.Publish(ctx, "events", ev); !errors.Is(err, ErrEvent) || !strings.Contains(err.Error(), says) {
			t.Errorf("%q: got %v", says, err)
		}
	}
	before := time.Now().UnixMilli()
	evs := []Event{
		{Key: "k", Type: "t", ID: "at", NotBefore: at},
		{Key: "k", Type: "t", ID: "in", Delay: 15 * time.Minute},
		{Key: "k", Type: "t", ID: "now"},
	}
	var ds []Delivery
	for _, ev := range evs {
		d, err := p.Publish(ctx, "events", ev)
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	after := time.Now().UnixMilli()
	cl, err := kgo.NewClient(kgo.SeedBrokers(boot), kgo.MaxVersions(func() *kversion.Versions {
		v := kversion.Stable()
		v.SetMaxKeyVersion(apiVersionsKey, 2)
		return v
	}()), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{"events": {ds[0].Partition: kgo.NewOffset().At(ds[0].Offset)}}))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var got []*Envelope
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for len(got) < 3 && pctx.Err() == nil {
		cl.PollFetches(pctx).EachRecord(func(r *kgo.Record) {
			e, err := Decode(r.Key, r.Value)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, e)
		})
	}
	if len(got) != 3 || got[0].ID != "at" || got[1].ID != "in" || got[2].ID != "now" {
		t.Fatalf("read back %+v", got)
	}
	if got[0].NotBefore != at.UnixMilli() || got[2].NotBefore != 0 {
		t.Fatalf("not before: %d, %d", got[0].NotBefore, got[2].NotBefore)
	}
	if nb := got[1].NotBefore; nb < before+900000 || nb > after+900000 {
		t.Fatalf("Delay 15m: not before %d, published between %d and %d", nb, before, after)
	}
}

// embeddedPublisher is a Publisher on embedded(t), closed when t ends.
func embeddedPublisher(t *testing.T) (string, *Publisher) {
	boot := embedded(t)
	p, err := NewPublisher(boot, WithEmbeddedCluster())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return boot, p
}

func TestRefusedEventsAndChangedCounts(t *testing.T) {
	boot, p := embeddedPublisher(t)
	ctx := context.Background()
	_, err := p.Publish(ctx, "events", Event{Key: "k", Type: "t", ID: "~events/0/1/0"})
	if !errors.Is(err, ErrEvent) || !strings.Contains(err.Error(), "begins with '~'") {
		t.Fatal(err)
	}
	p.setLive("events", 8)
	_, err = p.Publish(ctx, "events", Event{Key: "k", Type: "t"})
	if !errors.Is(err, ErrPartitionsChanged) || !strings.Contains(err.Error(), "topic events has 8 partitions now, 6 when this publisher started") {
		t.Fatal(err)
	}
	q, err := NewPublisher(boot, WithEmbeddedCluster(), WithExpectPartitions(12), WithPartitionsCheck(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	_, err = q.Publish(ctx, "events", Event{Key: "k", Type: "t"})
	if !errors.Is(err, ErrPartitionsChanged) || !strings.Contains(err.Error(), "the fleet expects 12") {
		t.Fatal(err)
	}
}
