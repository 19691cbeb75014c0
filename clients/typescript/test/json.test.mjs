// Integers beyond 2^53 read as bigint and are written back as JSON integers; everything
// else reads and writes exactly as JSON.parse and JSON.stringify do.
import assert from 'node:assert/strict'
import { test } from 'node:test'

import { parseJson, stringifyJson } from '../dist/index.js'

const MAX = 2n ** 63n - 1n
const MIN = -(2n ** 63n)

test('integers beyond 2^53 read exactly, as bigint', () => {
  const text = `{"a":${MAX},"b":[${MIN},9007199254740993],"c":{"d":18446744073709551615}}`
  assert.deepEqual(parseJson(text), {
    a: MAX,
    b: [MIN, 9007199254740993n],
    c: { d: 18446744073709551615n },
  })
})

test('safe integers, decimals and exponents stay numbers', () => {
  const text = '{"a":9007199254740991,"b":-9007199254740991,"c":12345678901234567.5,"d":1e300,"e":0,"f":-0.5,"g":123456789012345678E2}'
  assert.deepEqual(parseJson(text), JSON.parse(text))
  for (const v of Object.values(parseJson(text))) assert.equal(typeof v, 'number')
})

test('digits inside strings are left alone, escapes included', () => {
  const text = String.raw`{"k\"12345678901234567890":"12345678901234567890","x":"a\\","y":99999999999999999999}`
  const parsed = parseJson(text)
  assert.equal(parsed['k"12345678901234567890'], '12345678901234567890')
  assert.equal(parsed.x, 'a\\')
  assert.equal(parsed.y, 99999999999999999999n)
})

test('bigints are written as JSON integers and round-trip', () => {
  const value = { id: MAX, list: [MIN, 1n, 2], text: '\u0000jf-int:1', n: 1.5 }
  const text = stringifyJson(value)
  assert.equal(text, `{"id":${MAX},"list":[${MIN},1,2],"text":"\\u0000jf-int:1","n":1.5}`)
  assert.deepEqual(parseJson(stringifyJson({ id: MAX, list: [MIN] })), { id: MAX, list: [MIN] })
})

test('without big integers the result is JSON.parse and JSON.stringify', () => {
  const value = { a: [1, 'two', null, true, { b: 'ü €\u2028' }], c: -3.25e-7 }
  assert.equal(stringifyJson(value), JSON.stringify(value))
  assert.deepEqual(parseJson(JSON.stringify(value)), value)
  assert.throws(() => parseJson('{"a":'), SyntaxError)
})
