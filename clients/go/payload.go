package keylane

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
)

// Payload returns a payload's bytes: a []byte as it is; a json.RawMessage,
// and any other value through encoding/json, as the msgpack `keylane
// publish` stores for that JSON (objects as maps in their order, integers
// in the smallest int form, other numbers float64, strings, arrays, null,
// booleans). So a struct or a map[string]any is packed as its JSON says.
func Payload(v any) ([]byte, error) {
	var text []byte
	switch p := v.(type) {
	case []byte:
		if len(p) > PayloadMax {
			return nil, invalid("envelope field \"p\" is %d bytes, the limit is %d", len(p), PayloadMax)
		}
		return p, nil
	case nil:
		return nil, nil
	case json.RawMessage:
		text = p
	default:
		var err error
		if text, err = json.Marshal(v); err != nil {
			return nil, invalid("the payload cannot be written as JSON, so not as its msgpack either (%v): pass []byte or JSON-able data", err)
		}
	}
	out, err := JSONToMsgpack(text)
	if err != nil {
		return nil, err
	}
	if len(out) > PayloadMax {
		return nil, invalid("envelope field \"p\" is %d bytes, the limit is %d", len(out), PayloadMax)
	}
	return out, nil
}

// maxDepth is keylane's KL_JSON_DEPTH_MAX.
const maxDepth = 64

// JSONToMsgpack packs one JSON value as msgpack, as keylane's
// kl__json_to_msgpack() does.
func JSONToMsgpack(text []byte) ([]byte, error) {
	d := json.NewDecoder(bytes.NewReader(text))
	d.UseNumber()
	out, err := packJSON(d, nil, 1)
	if err != nil {
		return nil, invalid("the payload's JSON: %v", err)
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, invalid("the payload's JSON has more than one value")
	}
	return out, nil
}

func packJSON(d *json.Decoder, b []byte, depth int) ([]byte, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("JSON nests deeper than %d levels", maxDepth)
	}
	tok, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		var inner []byte
		n := 0
		for d.More() {
			if t == '{' {
				key, err := d.Token()
				if err != nil {
					return nil, err
				}
				inner = putStr(inner, key.(string))
			}
			if inner, err = packJSON(d, inner, depth+1); err != nil {
				return nil, err
			}
			n++
		}
		if _, err := d.Token(); err != nil { // the closing delimiter
			return nil, err
		}
		if t == '{' {
			return append(putMap(b, n), inner...), nil
		}
		return append(putArray(b, n), inner...), nil
	case string:
		return putStr(b, t), nil
	case json.Number:
		if i, err := strconv.ParseInt(string(t), 10, 64); err == nil {
			return putInt(b, i), nil
		}
		f, err := strconv.ParseFloat(string(t), 64)
		if err != nil || math.IsInf(f, 0) {
			return nil, fmt.Errorf("the number %s does not fit a float64", t)
		}
		return putBE(b, 0xcb, math.Float64bits(f), 8), nil
	case bool:
		if t {
			return append(b, 0xc3), nil
		}
		return append(b, 0xc2), nil
	case nil:
		return append(b, 0xc0), nil
	}
	return nil, fmt.Errorf("unexpected JSON token %v", tok)
}
