/** A small Server-Sent Events reader: (event, data) pairs; comments are skipped. */

export interface SseEvent {
  event: string
  data: string
  /** The `id` this event carried, if any (not carried over from earlier events). */
  id?: string
}

/**
 * The lines of a stream given in pieces, split as the SSE format says: CRLF, LF or CR
 * alone ends a line, wherever the pieces begin and end.
 */
class LineSplitter {
  // One per splitter: exec() keeps its place in lastIndex, which streams must not share.
  private readonly lineEnd = /\r\n|\r|\n/g
  private partial = ''
  // The last piece ended in CR: its line is out already, and an LF opening the next
  // piece is the rest of that CRLF, not an empty line (which would end the event).
  private afterCr = false

  push(text: string): string[] {
    const lines: string[] = []
    if (text === '') return lines
    let start = 0
    if (this.afterCr && text.startsWith('\n')) start = 1
    this.afterCr = false
    this.lineEnd.lastIndex = start
    let end: RegExpExecArray | null
    while ((end = this.lineEnd.exec(text)) !== null) {
      const line = this.partial + text.slice(start, end.index)
      this.partial = ''
      start = this.lineEnd.lastIndex
      // A CR at the end may be half a CRLF; the line is complete either way, so it goes
      // out now rather than waiting for the next piece (seconds away: a keep-alive).
      if (start === text.length && end[0] === '\r') this.afterCr = true
      lines.push(line)
    }
    this.partial += text.slice(start)
    return lines
  }
}

export async function* readSse(body: ReadableStream<Uint8Array>): AsyncGenerator<SseEvent> {
  // One decoder for the whole stream: it holds a UTF-8 sequence split between chunks,
  // and drops a leading byte order mark as the format asks.
  const decoder = new TextDecoder()
  const lines = new LineSplitter()
  let event = 'message'
  let data: string[] = []
  let id: string | undefined
  // An event the stream ends before its blank line is discarded, as the format says.
  for await (const chunk of body as unknown as AsyncIterable<Uint8Array>) {
    for (const line of lines.push(decoder.decode(chunk, { stream: true }))) {
      if (line === '') {
        if (data.length > 0) yield { event, data: data.join('\n'), id }
        event = 'message'
        data = []
        id = undefined
        continue
      }
      if (line.startsWith(':')) continue
      const colon = line.indexOf(':')
      const name = colon < 0 ? line : line.slice(0, colon)
      let value = colon < 0 ? '' : line.slice(colon + 1)
      if (value.startsWith(' ')) value = value.slice(1)
      if (name === 'event') event = value
      else if (name === 'data') data.push(value)
      else if (name === 'id') id = value
    }
  }
}
