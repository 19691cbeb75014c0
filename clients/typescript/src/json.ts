// JSON that keeps integers exactly. `JSON.parse` reads every number as a double, so an
// integer beyond 2^53 in a job's variables (an id from another system, a 64-bit
// counter) comes back rounded; Jobfair stores integers up to 64 bits as sent. Here such
// an integer is read as a `bigint`, and a `bigint` is written as a JSON integer (where
// `JSON.stringify` throws). Every other value reads and writes as `JSON.parse` and
// `JSON.stringify` do.
//
// Node 20 has no reviver that sees a number's source text, so the text is scanned once
// for integer literals too long to be safe, outside strings. Each is quoted with a NUL
// prefix, which no value from Jobfair can contain (the server refuses NUL in every
// string), and a reviver turns those strings into bigints. Written out, each bigint
// becomes such a string, which is then unquoted.

const MARK = '\u0000jf-int:'

/** Whether integer literal `digits` (optional minus, then digits) fits a double exactly. */
function isSafe(digits: string): boolean {
  const n = digits.startsWith('-') ? digits.length - 1 : digits.length
  return n < 16 || Number.isSafeInteger(Number(digits))
}

/** `text` with each unsafe integer literal outside strings quoted and marked, or `text`
 * itself when it has none (the common case costs one scan and no copy). */
function markUnsafeIntegers(text: string): string {
  let out: string[] | null = null
  let last = 0
  let i = 0
  const n = text.length
  while (i < n) {
    const c = text.charCodeAt(i)
    if (c === 0x22) {
      // A string: skip to its closing quote, past escapes.
      i++
      while (i < n) {
        const d = text.charCodeAt(i)
        if (d === 0x5c) i += 2
        else if (d === 0x22) break
        else i++
      }
      i++
    } else if (c === 0x2d || (c >= 0x30 && c <= 0x39)) {
      const start = i
      i++
      while (i < n && text.charCodeAt(i) >= 0x30 && text.charCodeAt(i) <= 0x39) i++
      const next = i < n ? text.charCodeAt(i) : 0
      const fraction = next === 0x2e || next === 0x65 || next === 0x45 // . e E
      if (fraction) {
        while (i < n && /[0-9.eE+-]/.test(text[i])) i++
        continue
      }
      const literal = text.slice(start, i)
      if (!isSafe(literal)) {
        out ??= []
        out.push(text.slice(last, start), `"\\u0000jf-int:${literal}"`) // MARK, escaped
        last = i
      }
    } else {
      i++
    }
  }
  if (out === null) return text
  out.push(text.slice(last))
  return out.join('')
}

function revive(_key: string, value: unknown): unknown {
  return typeof value === 'string' && value.startsWith(MARK) ? BigInt(value.slice(MARK.length)) : value
}

/** `JSON.parse`, with integers beyond 2^53 read as `bigint`. */
export function parseJson(text: string): unknown {
  const marked = markUnsafeIntegers(text)
  return marked === text ? JSON.parse(text) : JSON.parse(marked, revive)
}

/** `JSON.stringify`, with `bigint` values written as JSON integers. */
export function stringifyJson(value: unknown): string {
  // A mark of this call's own: a string of the caller's that looks like one stays a string.
  const nonce = Math.random().toString(36).slice(2)
  let big = false
  const text = JSON.stringify(value, (_key, v: unknown) => {
    if (typeof v !== 'bigint') return v
    big = true
    return `${MARK}${nonce}:${v.toString()}`
  })
  if (!big) return text
  return text.replace(new RegExp(`"\\\\u0000jf-int:${nonce}:(-?\\d+)"`, 'g'), '$1')
}
