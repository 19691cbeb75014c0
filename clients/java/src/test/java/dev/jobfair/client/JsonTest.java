package dev.jobfair.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.math.BigDecimal;
import java.math.BigInteger;
import java.util.List;
import java.util.Map;
import java.util.Random;
import org.junit.jupiter.api.Test;

/**
 * Json on its own (no server): every JSON number reads and writes back as the same number,
 * whatever its size; what is not a JSON number is refused.
 */
class JsonTest {
    /** parse, then write: the same number, if not the same text ({@code 1e2} may come back {@code 100.0}). */
    static void assertRoundTrips(String number) {
        String written = Json.write(Json.parse(number));
        assertEquals(0, new BigDecimal(number).compareTo(new BigDecimal(written)),
                () -> number + " came back as " + written);
    }

    @Test
    void integersBeyond64BitsReadAsBigIntegerAndWriteBackExactly() {
        for (String n : List.of("9223372036854775808", "-9223372036854775809", "18446744073709551616",
                "-18446744073709551616", "123456789012345678901234567890123456789")) {
            Object parsed = Json.parse(n);
            assertEquals(new BigInteger(n), parsed, n);
            assertEquals(n, Json.write(parsed));
        }
        // Up to 64 bits they stay Long, as before.
        assertEquals(Long.MAX_VALUE, Json.parse("9223372036854775807"));
        assertEquals(Long.MIN_VALUE, Json.parse("-9223372036854775808"));
        assertEquals(-3L, Json.parse("-3"));
        assertEquals(0L, Json.parse("-0"));
    }

    @Test
    void anActivationWithAHugeIntegerInItsVariablesIsReadable() {
        String answer = "{\"jobs\":[{\"jobKey\":\"7\",\"type\":\"t\",\"tenantId\":\"<default>\","
                + "\"state\":\"ACTIVATED\",\"priority\":50,\"effectivePriority\":50,\"retries\":3,"
                + "\"activationCount\":1,\"variables\":{\"id\":18446744073709551616,\"n\":-99999999999999999999}}]}";
        @SuppressWarnings("unchecked")
        Map<String, Object> d = (Map<String, Object>) ((List<?>) Json.parseObject(answer).get("jobs")).get(0);
        Job job = Job.fromJson(d);
        assertEquals(new BigInteger("18446744073709551616"), job.variables().get("id"));
        // Completing with the variables it was given sends them back unchanged.
        assertEquals("{\"id\":18446744073709551616,\"n\":-99999999999999999999}", Json.write(job.variables()));
    }

    @Test
    void decimalsKeepTheirValue() {
        // What a double holds to the digits written stays a Double, as before ...
        assertEquals(2.5, Json.parse("2.5"));
        assertEquals(0.1, Json.parse("0.1"));
        assertEquals(1e10, Json.parse("1e10"));
        assertEquals(-0.0, Json.parse("-0.0"));
        // ... the rest is a BigDecimal, which keeps every digit.
        for (String n : List.of("3.14159265358979323846264338327950288", "0.1000000000000000055511151231257827",
                "1e400", "-1E+400", "1e-400", "123456789012345678901234567890.5", "9007199254740993.0")) {
            assertInstanceOf(BigDecimal.class, Json.parse(n), n);
            assertRoundTrips(n);
        }
        for (String n : List.of("2.5", "0.1", "-1.5E-7", "1e10", "1E2", "6.02214076e23", "-0.0", "0.0")) {
            assertRoundTrips(n);
        }
    }

    @Test
    void randomNumbersOfEverySizeRoundTrip() {
        Random random = new Random(19);
        for (int i = 0; i < 5000; i++) {
            BigInteger unscaled = new BigInteger(1 + random.nextInt(200), random);
            if (random.nextBoolean()) unscaled = unscaled.negate();
            String n = switch (random.nextInt(3)) {
                case 0 -> unscaled.toString();                                        // an integer
                case 1 -> new BigDecimal(unscaled, 1 + random.nextInt(40)).toPlainString();  // 12.34
                default -> unscaled + (random.nextBoolean() ? "e" : "E-") + random.nextInt(500);
            };
            assertRoundTrips(n);
            // Inside a document too, where the number ends at a delimiter.
            String doc = "{\"v\":[" + n + "," + n + "]}";
            assertEquals(doc.replace(n, Json.write(Json.parse(n))), Json.write(Json.parse(doc)));
        }
    }

    @Test
    void otherNumberTypesAreWrittenAsJsonNumbers() {
        assertEquals("[1,2,3,4.5,0.25,1E+3]",
                Json.write(List.of(1, (short) 2, (byte) 3, 4.5f, 0.25, new BigDecimal("1E+3"))));
        // JSON has no NaN or infinity: refused rather than written as text no reader takes.
        for (double d : new double[] {Double.NaN, Double.POSITIVE_INFINITY, Double.NEGATIVE_INFINITY}) {
            assertThrows(IllegalArgumentException.class, () -> Json.write(Map.of("x", d)), String.valueOf(d));
        }
        assertThrows(IllegalArgumentException.class, () -> Json.write(Float.NaN));
    }

    @Test
    void whatIsNotAJsonNumberIsRefused() {
        for (String bad : List.of("01", "-01", "+1", "1.", ".5", "-", "1e", "1e+", "1.2.3", "1-2", "--1", "0x10", "1ee2")) {
            assertThrows(IllegalArgumentException.class, () -> Json.parse(bad), bad);
            assertThrows(IllegalArgumentException.class, () -> Json.parse("[" + bad + "]"), bad);
        }
    }
}
