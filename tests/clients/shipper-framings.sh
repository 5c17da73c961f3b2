#!/usr/bin/env bash
# The bodies Vector's and Fluent Bit's HTTP outputs send, sent with curl with their
# headers (neither ships in a registry this project installs from):
#   Vector `http` sink, encoding.codec=json: framing newline_delimited (application/x-ndjson)
#     and the default JSON array (application/json), with compression=gzip;
#   Fluent Bit `http` output: format json_lines (application/x-ndjson) and json (a JSON
#     array, application/json), with json_date_key=date as a double, plain and compress gzip.
# Each batch goes to a stream its bucket creates on the first append; each event must be one
# record, in order, in its canonical JSON form, and a batch with one bad line appends nothing.
# usage: tests/clients/shipper-framings.sh URSULA_URL
set -euo pipefail

URL="${1:?usage: shipper-framings.sh URSULA_URL}"
URL="${URL%/}"
TMP="$(mktemp -d "${TMPDIR:-/tmp}/ursula-framings.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

fail() {
    printf 'FAILED: %s\n' "$*" >&2
    exit 1
}

curl -sf -X PUT "$URL/shippers" -H 'content-type: application/json' \
    -d '{"auto_create":{"content_type":"application/json"}}' >/dev/null || fail "PUT /shippers"

# The events, one canonical JSON object a line, as the stream will hold them.
vector_events() {
    for i in 0 1 2 3 4; do
        printf '{"host":"web-1","message":"GET /cart/%d 200","source_type":"file","timestamp":"2026-12-06T10:00:0%d.000Z"}\n' "$i" "$i"
    done
}
fluentbit_events() {
    for i in 0 1 2 3 4; do
        printf '{"date":1796551200.%d25,"log":"worker %d: tick \\"ok\\"","stream":"stdout"}\n' "$i" "$i"
    done
}
# Newline-delimited lines to a JSON array.
as_array() { paste -sd, - | sed 's/^/[/; s/$/]/'; }

# post NAME CONTENT_TYPE ENCODING BODY_FILE EXPECTED_FILE [USER_AGENT]
post() {
    local name="$1" ctype="$2" encoding="$3" body="$4" expected="$5" agent="${6:-curl}"
    local headers=(-H "Content-Type: $ctype" -H "User-Agent: $agent")
    if [[ "$encoding" == gzip ]]; then
        gzip -c "$body" >"$body.gz"
        body="$body.gz"
        headers+=(-H "Content-Encoding: gzip")
    fi
    local status
    status="$(curl -s -o "$TMP/$name.resp" -w '%{http_code}' -X POST "$URL/shippers/$name" "${headers[@]}" \
        --data-binary "@$body")"
    [[ "$status" == 204 ]] || fail "$name: POST answered $status: $(cat "$TMP/$name.resp")"
    curl -sf "$URL/shippers/$name?offset=-1" >"$TMP/$name.read" || fail "$name: read"
    cmp -s "$TMP/$name.read" "$expected" || {
        diff "$expected" "$TMP/$name.read" >&2 || true
        fail "$name: the stream does not hold one canonical record per event"
    }
    local records want
    records="$(curl -sfI "$URL/shippers/$name" | tr -d '\r' | awk -F': ' 'tolower($1) == "stream-record-next" { print $2 }')"
    want="$(wc -l <"$expected")"
    [[ "$records" == "$want" ]] || fail "$name: $records records, expected $want"
    echo "$name: ok ($want records)"
}

vector_events >"$TMP/vector.ndjson"
vector_events | as_array >"$TMP/vector.json"
fluentbit_events >"$TMP/fluentbit.ndjson"
fluentbit_events | as_array >"$TMP/fluentbit.json"

post vector-ndjson application/x-ndjson gzip "$TMP/vector.ndjson" "$TMP/vector.ndjson" Vector/0.51.0
post vector-json application/json gzip "$TMP/vector.json" "$TMP/vector.ndjson" Vector/0.51.0
post fluentbit-json-lines application/x-ndjson identity "$TMP/fluentbit.ndjson" "$TMP/fluentbit.ndjson" Fluent-Bit
post fluentbit-json application/json identity "$TMP/fluentbit.json" "$TMP/fluentbit.ndjson" Fluent-Bit
post fluentbit-json-gzip application/json gzip "$TMP/fluentbit.json" "$TMP/fluentbit.ndjson" Fluent-Bit

# A batch with one bad line appends nothing and names the line, to an existing stream and
# to one not created yet.
{
    vector_events | head -n 2
    printf '{"host":"web-1","message":"cut off\n'
    vector_events | tail -n 2
} >"$TMP/bad.ndjson"
for name in vector-ndjson vector-bad; do
    before="$(curl -s -o /dev/null -w '%{http_code}' -I "$URL/shippers/$name")"
    status="$(curl -s -o "$TMP/bad.resp" -w '%{http_code}' -X POST "$URL/shippers/$name" \
        -H 'Content-Type: application/x-ndjson' --data-binary "@$TMP/bad.ndjson")"
    [[ "$status" == 400 ]] || fail "$name: a bad line answered $status"
    grep -q '^invalid_json: line 3 ' "$TMP/bad.resp" || fail "$name: $(cat "$TMP/bad.resp")"
    if [[ "$before" == 200 ]]; then
        curl -sf "$URL/shippers/$name?offset=-1" | cmp -s - "$TMP/vector.ndjson" ||
            fail "$name: a refused batch changed the stream"
    else
        after="$(curl -s -o /dev/null -w '%{http_code}' -I "$URL/shippers/$name")"
        [[ "$after" == 404 ]] || fail "$name: a refused first batch created the stream ($after)"
    fi
done
echo "a batch with a bad line: 400 naming line 3, nothing appended or created"
