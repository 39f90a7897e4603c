package keylane

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
)

func TestEnvelopeIsTheCEncodersBytes(t *testing.T) {
	p, err := Payload(map[string]any{"amount": 5})
	if err != nil {
		t.Fatal(err)
	}
	got, err := CheckEvent("acct-1", &Envelope{ID: "id-1", Type: "credit", TS: 1700000000000, Payload: p})
	if err != nil {
		t.Fatal(err)
	}
	want := []byte("\x85\xa1v\x01\xa2id\xa4id-1\xa1t\xa6credit\xa2ts\xcf\x00\x00\x01\x8b\xcf\xe5\x68\x00" +
		"\xa1p\xc4\x09\x81\xa6amount\x05")
	if !bytes.Equal(got, want) {
		t.Fatalf("got %x\nwant %x", got, want)
	}
}

func TestRoundTripAtTheWidthBoundaries(t *testing.T) {
	for _, n := range []int{0, 31, 32, 255, 256, 65535, 65536} {
		for _, ts := range []int64{0, -1, -33, 127, 128, 1 << 40, -(1 << 40)} {
			typ := strings.Repeat("t", n%255+1)
			e := &Envelope{ID: "i", Type: typ, TS: ts, Payload: bytes.Repeat([]byte("x"), n),
				Headers: []Header{{"a", strings.Repeat("v", n%4096)}}}
			value, err := CheckEvent("k", e)
			if err != nil {
				t.Fatal(err)
			}
			back, err := Decode([]byte("k"), value)
			if err != nil {
				t.Fatalf("n=%d ts=%d: %v", n, ts, err)
			}
			if back.Type != typ || back.TS != ts || len(back.Payload) != n || back.Headers[0] != e.Headers[0] {
				t.Fatalf("n=%d ts=%d: %+v", n, ts, back)
			}
		}
	}
}

func TestRefusalsNameTheFieldAndTheLimit(t *testing.T) {
	long := func(n int) string { return strings.Repeat("x", n) }
	cases := []struct {
		key  string
		e    Envelope
		says string
	}{
		{"", Envelope{ID: "i", Type: "t"}, "message has no key; the entity key is required, 1..1024 bytes"},
		{long(1025), Envelope{ID: "i", Type: "t"}, "message key is 1025 bytes, the limit is 1024"},
		{"k", Envelope{ID: "i", Type: ""}, `envelope field "t" is empty`},
		{"k", Envelope{ID: "i", Type: long(256)}, `envelope field "t" is 256 bytes, the limit is 255`},
		{"k", Envelope{ID: "", Type: "t"}, `envelope field "id" is empty`},
		{"k", Envelope{ID: long(256), Type: "t"}, `envelope field "id" is 256 bytes, the limit is 255`},
		{"k", Envelope{ID: "a\x00b", Type: "t"}, `envelope field "id" holds a NUL at byte 1`},
		{"k", Envelope{ID: "\xff", Type: "t"}, `envelope field "id" is not valid UTF-8 at byte 0`},
		{"k", Envelope{ID: "~events/0/1/0", Type: "t"}, `id "~events/0/1/0" begins with '~', which keylane keeps for the ids it derives for follow-up events: choose an id that does not (or omit it to have one made)`},
		{"k", Envelope{ID: "i", Type: "t", Payload: make([]byte, PayloadMax+1)}, `envelope field "p" is 1046529 bytes, the limit is 1046528`},
		{"k", Envelope{ID: "i", Type: "t", Headers: []Header{{"", "v"}}}, "header 0 has an empty name"},
		{"k", Envelope{ID: "i", Type: "t", Headers: []Header{{"a", ""}, {"a", ""}}}, `header "a" appears twice`},
		{"k", Envelope{ID: "i", Type: "t", Headers: []Header{{"n", long(4097)}}}, `header "n" value is 4097 bytes, the limit is 4096`},
		{"k", Envelope{ID: "i", Type: "t", Headers: []Header{{"traceparent", "00-abc"}}}, `header traceparent "00-abc" is not a W3C traceparent`},
		{long(1024), Envelope{ID: "i", Type: "t", Payload: make([]byte, PayloadMax), Headers: func() (h []Header) {
			for i := 0; i < 10; i++ {
				h = append(h, Header{string(rune('a' + i)), long(4096)})
			}
			return
		}()}, "as a Kafka record (key 1024 + envelope"},
	}
	for _, c := range cases {
		_, err := CheckEvent(c.key, &c.e)
		if err == nil || !errors.Is(err, ErrEvent) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%q %+.80v: got %v, want %q", c.key, c.e, err, c.says)
		}
	}
}

func TestDecoderRefusesWhatTheWorkerRefuses(t *testing.T) {
	good, _ := CheckEvent("k", &Envelope{ID: "i", Type: "t", TS: 1})
	cases := map[string]string{
		"":                         "message value is empty",
		"\x91\x01":                 "it must be a map",
		string(good[:len(good)-1]): "truncated",
		string(good) + "\x00":      "trailing bytes: 1",
		"\x81\xa1x\x01":            `a field "x" that version 2 does not define (v, id, t, ts, p, h, nb)`,
		"\x81\xa1v\x03":            `envelope version "v" is 3, this build reads versions 1 to 2`,
		"\x81\xa1v\x00":            `envelope version "v" is 0`,
		"\x82\xa1v\x01\xa1v\x01":   `envelope field "v" appears twice`,
		"\x81\xa1v\x01":            `lacks the required field "id"`,
		"\x82\xa1v\x01\xa1p\xa1x":  `envelope field "p" is a msgpack str, it must be a bin`,
	}
	for value, says := range cases {
		_, err := Decode([]byte("k"), []byte(value))
		if err == nil || !strings.Contains(err.Error(), says) {
			t.Errorf("%x: got %v, want %q", value, err, says)
		}
	}
	// a follow-up's id, which only keylane makes, decodes; so does a due
	// timer's type (the worker, not the decoder, judges who wrote it)
	v := AppendEnvelope(nil, &Envelope{ID: "~t/0/1/0", Type: "t"})
	if e, err := Decode([]byte("k"), v); err != nil || e.ID != "~t/0/1/0" {
		t.Fatal(e, err)
	}
	v = AppendEnvelope(nil, &Envelope{ID: "i", Type: "~timer", NotBefore: 9})
	if e, err := Decode([]byte("k"), v); err != nil || e.Type != "~timer" || e.NotBefore != 9 {
		t.Fatal(e, err)
	}
}

// "nb" (not before) is version 2's: a positive int, last, and refused on
// version 1, as keylane's decoder refuses it.
func TestDelayedEnvelopeIsTheCEncodersBytes(t *testing.T) {
	p, _ := Payload(map[string]any{"amount": 5})
	got, err := CheckEvent("acct-1", &Envelope{ID: "id-1", Type: "credit", TS: 1700000000000, Payload: p, NotBefore: 1700000900000})
	if err != nil {
		t.Fatal(err)
	}
	want := []byte("\x86\xa1v\x02\xa2id\xa4id-1\xa1t\xa6credit\xa2ts\xcf\x00\x00\x01\x8b\xcf\xe5\x68\x00" +
		"\xa1p\xc4\x09\x81\xa6amount\x05\xa2nb\xcf\x00\x00\x01\x8b\xcf\xf3\x23\xa0")
	if !bytes.Equal(got, want) {
		t.Fatalf("got %x\nwant %x", got, want)
	}
	got = AppendEnvelope(nil, &Envelope{ID: "i", Type: "t", Headers: []Header{{"a", "1"}}, NotBefore: 200})
	want = []byte("\x87\xa1v\x02\xa2id\xa1i\xa1t\xa1t\xa2ts\x00\xa1p\xc4\x00\xa1h\x81\xa1a\xa11\xa2nb\xcc\xc8")
	if !bytes.Equal(got, want) {
		t.Fatalf("got %x\nwant %x", got, want)
	}
	e, err := Decode([]byte("k"), got)
	if err != nil || e.NotBefore != 200 {
		t.Fatal(e, err)
	}
	v1 := "\x86\xa1v\x01\xa2id\xa1i\xa1t\xa1t\xa2ts\x00\xa1p\xc4\x00"
	v2 := "\x86\xa1v\x02\xa2id\xa1i\xa1t\xa1t\xa2ts\x00\xa1p\xc4\x00"
	cases := map[string]string{
		v1 + "\xa2nb\x05":  `the field "nb" (not before) but version 1, which lacks it`,
		v2 + "\xa2nb\x00":  `envelope field "nb" is 0, it must be a positive int`,
		v2 + "\xa2nb\xfb":  `envelope field "nb" is -5, it must be a positive int`,
		v2 + "\xa2nb\xc0":  `envelope field "nb" is a msgpack value of another type`,
		v2 + "\xa2nb\xa15": `envelope field "nb" is a msgpack str`,
		v2 + "\xa2nb\xcf\xff\xff\xff\xff\xff\xff\xff\xff": `envelope field "nb" is 18446744073709551615, the limit is`,
	}
	for value, says := range cases {
		_, err := Decode([]byte("k"), []byte(value))
		if err == nil || !strings.Contains(err.Error(), says) {
			t.Errorf("%x: got %v, want %q", value, err, says)
		}
	}
	// version 2 without "nb" is an event applied when read
	if e, err := Decode([]byte("k"), []byte("\x85"+v2[1:])); err != nil || e.NotBefore != 0 {
		t.Fatal(e, err)
	}
}

func TestReservedTypesAndNegativeNotBeforeAreRefused(t *testing.T) {
	_, err := CheckEvent("k", &Envelope{ID: "i", Type: "~timer", NotBefore: 5})
	if !errors.Is(err, ErrEvent) || !strings.Contains(err.Error(), `type "~timer" begins with '~', which keylane keeps for its own records`) {
		t.Fatal(err)
	}
	_, err = CheckEvent("k", &Envelope{ID: "i", Type: "t", NotBefore: -1})
	if !errors.Is(err, ErrEvent) || !strings.Contains(err.Error(), "not_before is -1") {
		t.Fatal(err)
	}
	if _, err := CheckEvent("k", &Envelope{ID: "i", Type: "a~"}); err != nil {
		t.Fatal(err)
	}
}

func TestPayloadPacksAsKeylanePublishPacksJSON(t *testing.T) {
	cases := map[string]string{
		`{"b":[1,-1,200,-200,70000,1099511627776,1.5,null,true,"s"],"a":{}}`: "82a162" + "9a" + "01" + "ff" + "ccc8" + "d1ff38" + "ce00011170" + "cf0000010000000000" + "cb3ff8000000000000" + "c0" + "c3" + "a173" + "a161" + "80",
		`"x"`: "a178",
		`[]`:  "90",
	}
	for text, want := range cases {
		got, err := JSONToMsgpack([]byte(text))
		if err != nil {
			t.Fatal(err)
		}
		if h := hexs(got); h != want {
			t.Errorf("%s: got %s, want %s", text, h, want)
		}
	}
	type credit struct {
		Amount int `json:"amount"`
		Seq    int `json:"seq"`
	}
	got, _ := Payload(credit{5, 1})
	if h := hexs(got); h != "82a6616d6f756e7405a373657101" {
		t.Errorf("a struct packs as its JSON: %s", h)
	}
	if raw, _ := Payload([]byte{1, 2}); !bytes.Equal(raw, []byte{1, 2}) {
		t.Error("bytes are taken as they are")
	}
	if _, err := Payload(make(chan int)); err == nil || !errors.Is(err, ErrEvent) {
		t.Error("a value JSON cannot write is refused:", err)
	}
}

func hexs(b []byte) string {
	const digits = "0123456789abcdef"
	var s strings.Builder
	for _, c := range b {
		s.WriteByte(digits[c>>4])
		s.WriteByte(digits[c&15])
	}
	return s.String()
}

func TestIDsAreUUIDv7AndOnlyGrow(t *testing.T) {
	var mu sync.Mutex
	var all []string
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := make([]string, 3000)
			for i := range mine {
				mine[i] = NewID()
			}
			if !sort.StringsAreSorted(mine) {
				t.Error("ids of one goroutine do not grow")
			}
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	seen := map[string]bool{}
	for _, id := range all {
		if seen[id] || len(id) != 36 || id[14] != '7' || !strings.ContainsRune("89ab", rune(id[19])) {
			t.Fatalf("id %s: duplicate or not a UUIDv7", id)
		}
		seen[id] = true
	}
	a, b := newIDAt(1700000000500), newIDAt(1700000000000)
	if b <= a {
		t.Fatalf("a clock that steps back: %s then %s", a, b)
	}
}

func TestMurmur2MatchesKafkaAndLibrdkafka(t *testing.T) {
	java := map[string]int32{"21": -973932308, "foobar": -790332482, "a-little-bit-long-string": -985981536,
		"a-little-bit-longer-string": -1486304829, "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971, "abc": 479470107}
	for k, v := range java {
		if Murmur2([]byte(k)) != uint32(v) {
			t.Errorf("%s: %d, want %d", k, int32(Murmur2([]byte(k))), v)
		}
	}
	rd := map[string]uint32{"kafka": 0xd067cf64, "giberish123456789": 0x8f552b0c, "1234": 0x9fc97b14, "234": 0xe7c009ca,
		"34": 0x873930da, "4": 0x5a4b5ca1, "": 0x106e08d9}
	for k, v := range rd {
		if Murmur2([]byte(k)) != v {
			t.Errorf("%q: %x, want %x", k, Murmur2([]byte(k)), v)
		}
	}
	h := int32(-973932308)
	if Partition([]byte("21"), 1000) != int32((uint32(h)&0x7fffffff)%1000) || Partition([]byte("k"), 0) != -1 {
		t.Error("partition: the sign bit is masked, not abs()")
	}
}

// CheckNotBefore gives every case of the table kl_publish() is held to
// its error word for word, or none.
func TestCheckNotBeforeCases(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "tests", "clients", "not_before_cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Now   int64 `json:"now_ms"`
		Cases []struct {
			NotBefore int64   `json:"not_before"`
			Max       int64   `json:"max_ms"`
			Error     *string `json:"error"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil || len(doc.Cases) < 10 {
		t.Fatal(err, len(doc.Cases))
	}
	for i, c := range doc.Cases {
		err := CheckNotBefore(c.NotBefore, doc.Now, c.Max)
		switch {
		case c.Error == nil && err != nil:
			t.Errorf("case %d (%d): refused: %v", i, c.NotBefore, err)
		case c.Error != nil && (err == nil || !errors.Is(err, ErrEvent) || err.Error() != *c.Error):
			t.Errorf("case %d (%d): %v\nexpected: %s", i, c.NotBefore, err, *c.Error)
		}
	}
}
