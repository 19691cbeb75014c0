package dev.jobfair.client;

import java.math.BigDecimal;
import java.math.BigInteger;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * Just enough JSON for Jobfair's wire format, so the client has no dependencies: objects
 * become {@code Map<String, Object>}, arrays {@code List<Object>}.
 *
 * <p>Numbers keep their value, so a job's variables written back are the ones it was given:
 * an integer is a {@code Long}, or a {@code BigInteger} beyond 64 bits; a number with a
 * fraction or an exponent is a {@code Double} when the double prints as the same value
 * ({@code 2.5}, {@code 0.1}, {@code 1e10}), otherwise a {@code BigDecimal} (more digits than
 * a double holds, or beyond its range). Read them as {@code Number} to take either.
 */
public final class Json {
    private final String text;
    private int pos;

    private Json(String text) {
        this.text = text;
    }

    public static Object parse(String text) {
        Json p = new Json(text);
        p.space();
        Object value = p.value();
        p.space();
        if (p.pos != text.length()) throw p.error("trailing characters");
        return value;
    }

    @SuppressWarnings("unchecked")
    public static Map<String, Object> parseObject(String text) {
        Object value = parse(text);
        if (!(value instanceof Map)) throw new IllegalArgumentException("expected a JSON object");
        return (Map<String, Object>) value;
    }

    public static String write(Object value) {
        StringBuilder out = new StringBuilder();
        write(value, out);
        return out.toString();
    }

    private static void write(Object value, StringBuilder out) {
        if (value == null) {
            out.append("null");
        } else if (value instanceof String s) {
            quote(s, out);
        } else if (value instanceof Double || value instanceof Float) {
            // JSON has no NaN or infinity; written as text, no reader would take the document.
            if (!Double.isFinite(((Number) value).doubleValue()))
                throw new IllegalArgumentException("JSON has no number " + value);
            out.append(value);
        } else if (value instanceof Number || value instanceof Boolean) {
            out.append(value);
        } else if (value instanceof Map<?, ?> map) {
            out.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> e : map.entrySet()) {
                if (!first) out.append(',');
                first = false;
                quote(String.valueOf(e.getKey()), out);
                out.append(':');
                write(e.getValue(), out);
            }
            out.append('}');
        } else if (value instanceof Iterable<?> items) {
            out.append('[');
            boolean first = true;
            for (Object item : items) {
                if (!first) out.append(',');
                first = false;
                write(item, out);
            }
            out.append(']');
        } else {
            throw new IllegalArgumentException("cannot write " + value.getClass() + " as JSON");
        }
    }

    private static void quote(String s, StringBuilder out) {
        out.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                case '\n' -> out.append("\\n");
                case '\r' -> out.append("\\r");
                case '\t' -> out.append("\\t");
                default -> {
                    if (c < 0x20) out.append(String.format("\\u%04x", (int) c));
                    else out.append(c);
                }
            }
        }
        out.append('"');
    }

    private Object value() {
        if (pos >= text.length()) throw error("unexpected end");
        char c = text.charAt(pos);
        switch (c) {
            case '{':
                return object();
            case '[':
                return array();
            case '"':
                return string();
            case 't':
                return literal("true", Boolean.TRUE);
            case 'f':
                return literal("false", Boolean.FALSE);
            case 'n':
                return literal("null", null);
            default:
                return number();
        }
    }

    private Map<String, Object> object() {
        Map<String, Object> map = new LinkedHashMap<>();
        pos++;
        space();
        if (peek('}')) return map;
        while (true) {
            space();
            String key = string();
            space();
            expect(':');
            space();
            map.put(key, value());
            space();
            if (peek('}')) return map;
            expect(',');
        }
    }

    private List<Object> array() {
        List<Object> list = new ArrayList<>();
        pos++;
        space();
        if (peek(']')) return list;
        while (true) {
            space();
            list.add(value());
            space();
            if (peek(']')) return list;
            expect(',');
        }
    }

    private String string() {
        expect('"');
        StringBuilder out = new StringBuilder();
        while (true) {
            if (pos >= text.length()) throw error("unterminated string");
            char c = text.charAt(pos++);
            if (c == '"') return out.toString();
            if (c != '\\') {
                out.append(c);
                continue;
            }
            char e = text.charAt(pos++);
            switch (e) {
                case 'n' -> out.append('\n');
                case 't' -> out.append('\t');
                case 'r' -> out.append('\r');
                case 'b' -> out.append('\b');
                case 'f' -> out.append('\f');
                case 'u' -> {
                    out.append((char) Integer.parseInt(text.substring(pos, pos + 4), 16));
                    pos += 4;
                }
                default -> out.append(e);
            }
        }
    }

    /** A number as the JSON grammar has it: {@code -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?}. */
    private Number number() {
        int start = pos;
        peek('-');
        if (!peek('0') && digits() == 0) throw error("unexpected character");
        boolean integer = true;
        if (peek('.')) {
            integer = false;
            if (digits() == 0) throw error("expected a digit after '.'");
        }
        if (peek('e') || peek('E')) {
            integer = false;
            if (!peek('+')) peek('-');
            if (digits() == 0) throw error("expected a digit in the exponent");
        }
        String n = text.substring(start, pos);
        if (integer) {
            if (n.length() <= 18) return Long.parseLong(n); // 18 characters, sign included, always fit
            BigInteger big = new BigInteger(n);
            return big.bitLength() < 64 ? (Number) big.longValue() : big;
        }
        BigDecimal exact;
        try {
            exact = new BigDecimal(n);
        } catch (NumberFormatException e) {
            throw error("exponent out of range");
        }
        // parseDouble, not exact.doubleValue(): BigDecimal has no -0.
        double d = Double.parseDouble(n);
        if (Double.isFinite(d) && new BigDecimal(Double.toString(d)).compareTo(exact) == 0) return d;
        return exact;
    }

    private int digits() {
        int start = pos;
        while (pos < text.length() && text.charAt(pos) >= '0' && text.charAt(pos) <= '9') pos++;
        return pos - start;
    }

    private Object literal(String word, Object value) {
        if (!text.startsWith(word, pos)) throw error("unexpected literal");
        pos += word.length();
        return value;
    }

    private boolean peek(char c) {
        if (pos < text.length() && text.charAt(pos) == c) {
            pos++;
            return true;
        }
        return false;
    }

    private void expect(char c) {
        if (!peek(c)) throw error("expected '" + c + "'");
    }

    private void space() {
        while (pos < text.length() && Character.isWhitespace(text.charAt(pos))) pos++;
    }

    private IllegalArgumentException error(String what) {
        return new IllegalArgumentException("bad JSON at " + pos + ": " + what);
    }
}
