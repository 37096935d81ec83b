package io.ticketing.protocol;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import java.lang.reflect.Field;
import java.lang.reflect.Modifier;
import java.util.Arrays;
import java.util.Map;
import java.util.TreeMap;
import java.util.function.ToIntFunction;
import java.util.stream.Collectors;
import org.junit.jupiter.api.Test;

/** Every code table of this library equals protocol/constants.json, in both directions. */
class ConstantsTest {
    private static final JsonObject CONSTANTS = ProtocolFiles.read("constants.json");

    private static Map<String, Long> table(String name) {
        Map<String, Long> m = new TreeMap<>();
        for (JsonElement e : CONSTANTS.getAsJsonArray(name)) {
            JsonObject o = e.getAsJsonObject();
            m.put(o.get("name").getAsString(), o.get("value").getAsLong());
        }
        return m;
    }

    private static <E extends Enum<E>> Map<String, Long> ours(Class<E> type, ToIntFunction<E> value) {
        return Arrays.stream(type.getEnumConstants())
                .collect(Collectors.toMap(Enum::name, e -> (long) value.applyAsInt(e), (a, b) -> a, TreeMap::new));
    }

    @Test
    void version() {
        assertEquals(CONSTANTS.get("version").getAsInt(), Protocol.VERSION);
    }

    @Test
    void ops() {
        assertEquals(table("ops"), ours(Op.class, Op::code));
        for (Op op : Op.values()) {
            assertEquals(op, Op.fromCode(op.code()));
        }
    }

    @Test
    void statuses() {
        assertEquals(table("statuses"), ours(Status.class, Status::code));
        for (Status s : Status.values()) {
            assertEquals(s, Status.fromCode(s.code()));
        }
    }

    @Test
    void invalidFields() {
        assertEquals(table("invalid_fields"), ours(InvalidField.class, InvalidField::code));
    }

    @Test
    void busyLimits() {
        assertEquals(table("busy_limits"), ours(BusyLimit.class, BusyLimit::code));
    }

    @Test
    void expiredReasons() {
        assertEquals(table("expired_reasons"), ours(ExpiredReason.class, ExpiredReason::code));
    }

    @Test
    void goawayReasons() {
        assertEquals(table("goaway_reasons"), ours(GoawayReason.class, GoawayReason::code));
    }

    @Test
    void inspectFlags() {
        assertEquals(table("inspect_flags"), ours(InspectFlag.class, InspectFlag::bit));
    }

    @Test
    void sizesAndClientRules() throws Exception {
        Map<String, Long> expected = new TreeMap<>();
        for (String section : new String[] {"sizes", "client_rules"}) {
            for (Map.Entry<String, JsonElement> e : CONSTANTS.getAsJsonObject(section).entrySet()) {
                expected.put(e.getKey(), e.getValue().getAsLong());
            }
        }
        Map<String, Long> actual = new TreeMap<>();
        for (Field f : Protocol.class.getFields()) {
            if (Modifier.isStatic(f.getModifiers()) && !f.getName().equals("VERSION")) {
                actual.put(f.getName(), ((Number) f.get(null)).longValue());
            }
        }
        assertEquals(expected, actual);
        assertNotNull(CONSTANTS.get("client_rules"));
    }
}
