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

func TestRefusedEventsAndChangedCounts(t *testing.T) {
	boot := embedded(t)
	p, err := NewPublisher(boot, WithEmbeddedCluster())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	_, err = p.Publish(ctx, "events", Event{Key: "k", Type: "t", ID: "~events/0/1/0"})
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
