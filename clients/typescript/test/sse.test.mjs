// The SSE reader on its own (no server): whatever the chunk boundaries, a stream reads as
// the same events. A CR ending one chunk and its LF opening the next is one line end, not
// two; a UTF-8 character split between chunks is one character; only CR, LF and CRLF end
// a line (the server's JSON carries U+2028 and U+0085 unescaped).
import assert from 'node:assert/strict'
import { test } from 'node:test'

import { readSse } from '../dist/index.js'

// What the server sends (sse-starlette: keep-alive comments, `id`, `event: job`, JSON
// data with non-ASCII text), plus the corners of the format: multi-line data, a data line
// that keeps a leading space, a field without a colon, unknown fields, and an event name
// with no data (nothing is dispatched, and the name does not leak into the next event).
const LINES = [
  ': keep-alive',
  '',
  'id: 17',
  'event: job',
  'data: {"jobKey":"17","variables":{"text":"héllo — 日本 😀","big":123456789012345678901234567890}}',
  '',
  ': keep-alive',
  '',
  'event: job',
  'data: first line',
  'data:  second, with a leading space',
  'data:',
  '',
  ':comment without a space',
  'data: a message without an event name',
  '',
  'event: job',
  'id: 18',
  'data:{"jobKey":"18","variables":{"separators":"line\u2028paragraph\u2029next\x85line"}}',
  '',
  'retry: 1000',
  'unknown: field',
  'data',
  '',
  'event: nothing-to-dispatch',
  '',
  'data: after it',
  '',
]

const EXPECTED = [
  { event: 'job', id: '17', data: '{"jobKey":"17","variables":{"text":"héllo — 日本 😀","big":123456789012345678901234567890}}' },
  { event: 'job', data: 'first line\n second, with a leading space\n' },
  { event: 'message', data: 'a message without an event name' },
  { event: 'job', id: '18', data: '{"jobKey":"18","variables":{"separators":"line\u2028paragraph\u2029next\x85line"}}' },
  { event: 'message', data: '' },
  { event: 'message', data: 'after it' },
]

/** The lines joined by one line end, or by CRLF, LF and CR in turn ("mixed"). */
function streamText(ending) {
  if (ending !== 'mixed') return LINES.map((line) => line + ending).join('')
  let text = ''
  LINES.forEach((line, i) => {
    let end = ['\r\n', '\n', '\r'][i % 3]
    // A CR followed by an empty line ended by LF would read as one CRLF.
    if (text.endsWith('\r') && line === '' && end === '\n') end = '\r\n'
    text += line + end
  })
  return text
}

const VARIANTS = {
  CRLF: streamText('\r\n'),
  LF: streamText('\n'),
  CR: streamText('\r'),
  mixed: streamText('mixed'),
  'CRLF after a byte order mark': '\uFEFF' + streamText('\r\n'),
}

function body(chunks) {
  return new ReadableStream({
    start(controller) {
      for (const chunk of chunks) controller.enqueue(chunk)
      controller.close()
    },
  })
}

async function parse(chunks) {
  const events = []
  // Only the fields the stream carried: an event without `id` may or may not have the key.
  for await (const { event, data, id } of readSse(body(chunks))) events.push(id === undefined ? { event, data } : { event, data, id })
  return events
}

for (const [name, text] of Object.entries(VARIANTS)) {
  const bytes = new TextEncoder().encode(text)

  test(`an SSE stream (${name}) reads the same split at every byte`, async () => {
    assert.deepEqual(await parse([bytes]), EXPECTED)
    for (let at = 0; at <= bytes.length; at++) {
      const events = await parse([bytes.subarray(0, at), bytes.subarray(at)])
      assert.deepEqual(events, EXPECTED, `split at byte ${at}: ${JSON.stringify(text.slice(0, 40))}…`)
    }
    const oneByteEach = Array.from(bytes, (_, i) => bytes.subarray(i, i + 1))
    assert.deepEqual(await parse(oneByteEach), EXPECTED, 'one byte per chunk')
  })
}

test('an event is handed over as soon as its blank line arrives, even if a lone CR ends the chunk', { timeout: 5000 }, async () => {
  let controller
  const stream = new ReadableStream({ start: (c) => void (controller = c) })
  const events = readSse(stream)
  const encode = (s) => new TextEncoder().encode(s)
  // The LF that completes this CRLF comes only with the next chunk, seconds later in a
  // real stream (the next keep-alive): the job must not wait for it.
  controller.enqueue(encode('event: job\r\ndata: 1\r\n\r'))
  assert.deepEqual((await events.next()).value, { event: 'job', data: '1', id: undefined })
  controller.enqueue(encode('\nevent: job\r\ndata: 2\r\n\r\n'))
  controller.close()
  assert.deepEqual((await events.next()).value, { event: 'job', data: '2', id: undefined })
  assert.equal((await events.next()).done, true)
})
