package keylane

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
)

// ErrPartitionsChanged is wrapped by the error of a publish to a topic
// whose partition count is not the one its keys were routed by: keys would
// move between owners, so nothing is published to it.
var ErrPartitionsChanged = errors.New("keylane: the topic's partition count changed")

// Event is one event to publish.
type Event struct {
	Key  string // the entity key, 1..KeyMax bytes (any bytes)
	Type string // 1..TypeMax bytes
	// Payload is []byte (taken as it is), or any value encoding/json
	// writes, packed as the msgpack `keylane publish` stores for that JSON.
	Payload any
	ID      string   // the idempotency id; "" makes one (a UUIDv7)
	Headers []Header // optional
	TS      int64    // ms since the epoch; 0 stamps the current time
	// NotBefore or Delay (from now), not both, delay the event: the worker
	// applies it, in its key's order, once that time has come. Zero: none.
	NotBefore time.Time
	Delay     time.Duration
}

// notBefore is ev's not-before time in ms since the epoch (0: none).
func (ev *Event) notBefore(now time.Time) (int64, error) {
	switch {
	case !ev.NotBefore.IsZero() && ev.Delay != 0:
		return 0, invalid("both NotBefore and Delay are given: pass one (NotBefore, a time, or Delay, a duration from now)")
	case !ev.NotBefore.IsZero():
		if ms := ev.NotBefore.UnixMilli(); ms > 0 {
			return ms, nil
		}
		return 0, invalid("NotBefore %s is not after the Unix epoch: give a later time, or none to have the event applied when it is read", ev.NotBefore.Format(time.RFC3339Nano))
	case ev.Delay < 0:
		return 0, invalid("Delay is %v, before now: give a Delay of 0 or more, or NotBefore", ev.Delay)
	case ev.Delay > 0:
		return now.Add(ev.Delay).UnixMilli(), nil
	}
	return 0, nil
}

// Delivery says where Kafka put an event.
type Delivery struct {
	Topic     string
	Partition int32
	Offset    int64
	ID        string
	Key       string
}

// Option configures a Publisher.
type Option func(*config)

type config struct {
	kgo             []kgo.Opt
	expect          int32
	check           time.Duration
	metadataTimeout time.Duration
	timerMax        time.Duration
}

// WithKgoOpts passes options to the franz-go client (kgo), e.g.
// kgo.ProducerLinger(5*time.Millisecond). keylane sets the partitioner
// after them (kgo.ManualPartitioner(): every record carries the partition
// keylane computed), so a partitioner option has no effect; it refuses a
// client that is not idempotent or does not wait for all in-sync replicas.
func WithKgoOpts(opts ...kgo.Opt) Option {
	return func(c *config) { c.kgo = append(c.kgo, opts...) }
}

// WithEmbeddedCluster lets the publisher talk to `keylane broker
// --embedded` (librdkafka's mock cluster), which does not answer
// franz-go's ApiVersions v3 request in a form it reads: it asks with v2,
// which every broker since Kafka 2.0 answers, and leaves every other
// request at its newest version.
func WithEmbeddedCluster() Option {
	return func(c *config) {
		v := kversion.Stable()
		v.SetMaxKeyVersion(apiVersionsKey, 2)
		c.kgo = append(c.kgo, kgo.MaxVersions(v))
	}
}

// apiVersionsKey is Kafka's request key of ApiVersions.
const apiVersionsKey = 18

// WithExpectPartitions refuses to publish to a topic with another
// partition count (without it, the count at a topic's first publish is
// the expected one).
func WithExpectPartitions(n int32) Option { return func(c *config) { c.expect = n } }

// WithPartitionsCheck sets how often the partition counts of the topics in
// use are read again (default 10 s).
func WithPartitionsCheck(d time.Duration) Option { return func(c *config) { c.check = d } }

// TimerMaxDelay is timer.max.delay's default: how far ahead of now, and
// behind it, a NotBefore may be (WithTimerMaxDelay).
const TimerMaxDelay = 7 * 24 * time.Hour

// WithTimerMaxDelay sets the workers' timer.max.delay (default
// TimerMaxDelay, 7 days): how far ahead of now, and behind it, an event's
// NotBefore may be (CheckNotBefore), as kl_publish() judges it.
func WithTimerMaxDelay(d time.Duration) Option { return func(c *config) { c.timerMax = d } }

type topicState struct {
	name     string
	count    int32 // routed by
	expect   int32
	expected bool // expect came from WithExpectPartitions
	live     atomic.Int32
}

func (t *topicState) refusal() error {
	live := t.live.Load()
	if t.expected {
		return fmt.Errorf("%w: topic %s has %d partitions, the fleet expects %d: keys would move between owners; recreate the topic or pass WithExpectPartitions(%d); nothing was published",
			ErrPartitionsChanged, t.name, live, t.expect, live)
	}
	return fmt.Errorf("%w: topic %s has %d partitions now, %d when this publisher started: keys moved between owners, and two workers could own one key; stop its producers, let the workers drain it, then restart the fleet with --partitions %d (WithExpectPartitions(%d)); nothing was published",
		ErrPartitionsChanged, t.name, live, t.expect, live, live)
}

// Publisher publishes events to keylane topics with a franz-go client: an
// idempotent producer with acks=all that routes every event itself
// (Partition, set on the record). Safe for concurrent use.
type Publisher struct {
	cl     *kgo.Client
	cfg    config
	mu     sync.Mutex
	topics map[string]*topicState
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once
}

// NewPublisher connects to the brokers of bootstrap
// ("HOST:PORT[,HOST:PORT]").
func NewPublisher(bootstrap string, opts ...Option) (*Publisher, error) {
	cfg := config{check: 10 * time.Second, metadataTimeout: 10 * time.Second, timerMax: TimerMaxDelay}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.timerMax < time.Second {
		return nil, fmt.Errorf("keylane: WithTimerMaxDelay(%v): give the workers' timer.max.delay, at least 1s", cfg.timerMax)
	}
	if bootstrap == "" {
		return nil, errors.New("keylane: no bootstrap servers: give the brokers as HOST:PORT[,HOST:PORT]")
	}
	if cfg.expect < 0 || cfg.expect > 100000 {
		return nil, fmt.Errorf("keylane: WithExpectPartitions(%d): a topic has 1..100000 partitions", cfg.expect)
	}
	kopts := append([]kgo.Opt{
		kgo.SeedBrokers(strings.Split(bootstrap, ",")...),
		kgo.AllowAutoTopicCreation(),
		kgo.ProducerBatchMaxBytes(MessageMax),
	}, cfg.kgo...)
	kopts = append(kopts, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	cl, err := kgo.NewClient(kopts...)
	if err != nil {
		return nil, fmt.Errorf("keylane: cannot create the Kafka client: %w", err)
	}
	if cl.OptValue(kgo.DisableIdempotentWrite) == true {
		cl.Close()
		return nil, errors.New("keylane: kgo.DisableIdempotentWrite(): keylane needs the idempotent producer (no duplicates or reordering on retry); remove it")
	}
	if acks, ok := cl.OptValue(kgo.RequiredAcks).(kgo.Acks); ok && acks != kgo.AllISRAcks() {
		cl.Close()
		return nil, errors.New("keylane: kgo.RequiredAcks(): keylane publishes with acks=all so that no acknowledged event is lost; remove it")
	}
	p := &Publisher{cl: cl, cfg: cfg, topics: map[string]*topicState{}, stop: make(chan struct{}), done: make(chan struct{})}
	go p.watch()
	return p, nil
}

// readCount reads the partition count of topic; 0 while it has no leaders.
func (p *Publisher) readCount(ctx context.Context, topic string) (int32, error) {
	req := kmsg.NewPtrMetadataRequest()
	t := kmsg.NewMetadataRequestTopic()
	t.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, t)
	req.AllowAutoTopicCreation = true
	resp, err := req.RequestWith(ctx, p.cl)
	if err != nil {
		return 0, fmt.Errorf("keylane: cannot read the partition count of topic %s: %w", topic, err)
	}
	if len(resp.Topics) != 1 {
		return 0, fmt.Errorf("keylane: metadata for topic %s came back empty", topic)
	}
	mt := resp.Topics[0]
	if err := kerr.ErrorForCode(mt.ErrorCode); err != nil {
		if err == kerr.LeaderNotAvailable || err == kerr.UnknownTopicOrPartition {
			return 0, nil
		}
		return 0, fmt.Errorf("keylane: topic %s: %w", topic, err)
	}
	return int32(len(mt.Partitions)), nil
}

func (p *Publisher) topic(ctx context.Context, name string) (*topicState, error) {
	p.mu.Lock()
	t := p.topics[name]
	p.mu.Unlock()
	if t != nil {
		return t, nil
	}
	if name == "" {
		return nil, errors.New("keylane: the topic is empty: give a topic name")
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.metadataTimeout)
	defer cancel()
	for {
		count, err := p.readCount(ctx, name)
		if err != nil {
			return nil, err
		}
		if count > 0 {
			t = &topicState{name: name, count: count, expect: count}
			if p.cfg.expect > 0 {
				t.expect, t.expected = p.cfg.expect, true
			}
			t.live.Store(count)
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("keylane: topic %s has no partition leaders after %v: does it exist? (%w)", name, p.cfg.metadataTimeout, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if old := p.topics[name]; old != nil {
		return old, nil
	}
	p.topics[name] = t
	return t, nil
}

// watch re-reads the partition counts of the topics in use.
func (p *Publisher) watch() {
	defer close(p.done)
	tick := time.NewTicker(p.cfg.check)
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-tick.C:
		}
		p.mu.Lock()
		topics := make([]*topicState, 0, len(p.topics))
		for _, t := range p.topics {
			topics = append(topics, t)
		}
		p.mu.Unlock()
		for _, t := range topics {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if count, err := p.readCount(ctx, t.name); err == nil && count > 0 {
				t.live.Store(count)
			}
			cancel()
		}
	}
}

// Partitions returns the live partition count of topic (read on first use).
func (p *Publisher) Partitions(ctx context.Context, topic string) (int32, error) {
	t, err := p.topic(ctx, topic)
	if err != nil {
		return 0, err
	}
	return t.live.Load(), nil
}

// record checks ev as kl_publish() does and makes its record.
func (p *Publisher) record(ctx context.Context, topic string, ev *Event) (*kgo.Record, string, error) {
	t, err := p.topic(ctx, topic)
	if err != nil {
		return nil, "", err
	}
	if t.live.Load() != t.expect {
		return nil, "", t.refusal()
	}
	clock := time.Now()
	now := clock.UnixMilli()
	env := Envelope{ID: ev.ID, Type: ev.Type, TS: ev.TS, Headers: ev.Headers}
	if env.NotBefore, err = ev.notBefore(clock); err != nil {
		return nil, "", err
	}
	if err = CheckNotBefore(env.NotBefore, now, p.cfg.timerMax.Milliseconds()); err != nil {
		return nil, "", err
	}
	if env.ID == "" {
		env.ID = newIDAt(now)
	}
	if env.TS == 0 {
		env.TS = now
	}
	if err := CheckKey(ev.Key); err != nil {
		return nil, "", err
	}
	if env.Payload, err = Payload(ev.Payload); err != nil {
		return nil, "", err
	}
	value, err := CheckEvent(ev.Key, &env)
	if err != nil {
		return nil, "", err
	}
	key := []byte(ev.Key)
	return &kgo.Record{Topic: topic, Key: key, Value: value, Partition: Partition(key, t.count)}, env.ID, nil
}

func delivery(r *kgo.Record, id string) Delivery {
	return Delivery{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, ID: id, Key: string(r.Key)}
}

// Publish publishes ev and waits until Kafka acknowledged it. An event
// kl_publish() would refuse is an error wrapping ErrEvent (nothing was
// sent); a changed partition count one wrapping ErrPartitionsChanged.
func (p *Publisher) Publish(ctx context.Context, topic string, ev Event) (Delivery, error) {
	r, id, err := p.record(ctx, topic, &ev)
	if err != nil {
		return Delivery{}, err
	}
	if err := p.cl.ProduceSync(ctx, r).FirstErr(); err != nil {
		return Delivery{ID: id, Topic: topic, Partition: r.Partition, Offset: -1, Key: ev.Key},
			fmt.Errorf("keylane: event %s was not delivered: %w", id, err)
	}
	return delivery(r, id), nil
}

// PublishAsync queues ev and returns its idempotency id at once; done
// (which may be nil) is called with its Delivery, or the reason Kafka did
// not take it, from a goroutine of the client's. It blocks while the
// client's buffer is full (ctx bounds the wait).
func (p *Publisher) PublishAsync(ctx context.Context, topic string, ev Event, done func(Delivery, error)) (string, error) {
	r, id, err := p.record(ctx, topic, &ev)
	if err != nil {
		return "", err
	}
	p.cl.Produce(ctx, r, func(r *kgo.Record, err error) {
		if done == nil {
			return
		}
		d := delivery(r, id)
		if err != nil {
			d.Offset = -1
			err = fmt.Errorf("keylane: event %s was not delivered: %w", id, err)
		}
		done(d, err)
	})
	return id, nil
}

// Flush waits until every queued event has its delivery (ctx bounds it).
func (p *Publisher) Flush(ctx context.Context) error { return p.cl.Flush(ctx) }

// Close flushes (10 s at most), stops the watch and closes the client.
func (p *Publisher) Close() {
	p.once.Do(func() {
		close(p.stop)
		<-p.done
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = p.cl.Flush(ctx)
		p.cl.Close()
	})
}

// setLive stores a live partition count, for tests of the refusal.
func (p *Publisher) setLive(topic string, n int32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t := p.topics[topic]; t != nil {
		t.live.Store(n)
	}
}
