package sparkstate.bench;

import java.io.Serializable;
import java.sql.Timestamp;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;

import org.apache.spark.api.java.function.FlatMapGroupsWithStateFunction;
import org.apache.spark.api.java.function.MapFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.streaming.GroupStateTimeout;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

/**
 * The JVM reference for the sessionization workload: {@code flatMapGroupsWithState} in append
 * mode with event-time timeouts, with the semantics of
 * {@code sparkstate.pipelines.sessionize(time_mode="event")}:
 *
 * <ul>
 *   <li>a batch's events of a key are ordered by event time (at equal times a last event goes last);</li>
 *   <li>an event more than {@code gap} after the open session's last event closes it ("timeout")
 *       and opens a new one; an {@code is_last} event closes the session ("last_event");</li>
 *   <li>an open session is the key's state, timing out at {@code max(end + gap, watermark)};
 *       when the timeout fires it is emitted ("timeout") and the state removed.</li>
 * </ul>
 *
 * Input rows are {@code (key string, event_time timestamp, data string, is_last boolean)}, with
 * the watermark already defined and null event times filtered out (as sessionize does).
 * Output: {@code key, session_start, session_end, event_count, events, closed_by}.
 */
public final class Sessionizer {

    private Sessionizer() {
    }

    /** The state of one key: its open session (epoch ms). A Java bean for {@code Encoders.bean}. */
    public static class OpenSession implements Serializable {
        private static final long serialVersionUID = 1L;
        private Long startMs;
        private Long endMs;
        private List<String> events = new ArrayList<>();

        public OpenSession() {
        }

        public Long getStartMs() {
            return startMs;
        }

        public void setStartMs(Long startMs) {
            this.startMs = startMs;
        }

        public Long getEndMs() {
            return endMs;
        }

        public void setEndMs(Long endMs) {
            this.endMs = endMs;
        }

        public List<String> getEvents() {
            return events;
        }

        public void setEvents(List<String> events) {
            this.events = events;
        }

        void add(long tMs, String data) {
            startMs = startMs == null ? tMs : Math.min(startMs, tMs);
            endMs = endMs == null ? tMs : Math.max(endMs, tMs);
            events.add(data);
        }
    }

    private static final class Event {
        final long tMs;
        final String data;
        final boolean last;

        Event(long tMs, String data, boolean last) {
            this.tMs = tMs;
            this.data = data;
            this.last = last;
        }
    }

    private static final Comparator<Event> ORDER =
            Comparator.<Event>comparingLong(e -> e.tMs).thenComparing(e -> e.last);

    public static StructType outputSchema(String keyColumn) {
        return new StructType()
                .add(keyColumn, DataTypes.StringType)
                .add("session_start", DataTypes.TimestampType)
                .add("session_end", DataTypes.TimestampType)
                .add("event_count", DataTypes.LongType)
                .add("events", DataTypes.createArrayType(DataTypes.StringType))
                .add("closed_by", DataTypes.StringType);
    }

    private static long millis(Object ts) {
        if (ts instanceof Timestamp) {
            return ((Timestamp) ts).getTime();
        }
        return ((Instant) ts).toEpochMilli();
    }

    private static Row output(String key, OpenSession s, String closedBy) {
        List<String> events = s.getEvents() == null ? new ArrayList<>() : s.getEvents();
        return RowFactory.create(
                key,
                s.getStartMs() == null ? null : new Timestamp(s.getStartMs()),
                s.getEndMs() == null ? null : new Timestamp(s.getEndMs()),
                (long) events.size(),
                events.toArray(new String[0]),
                closedBy);
    }

    private static FlatMapGroupsWithStateFunction<String, Row, OpenSession, Row> sessionizer(long gapMs) {
        return (key, rows, state) -> {
            List<Row> out = new ArrayList<>();
            if (state.hasTimedOut()) {
                OpenSession finished = state.get();
                state.remove();
                out.add(output(key, finished, "timeout"));
                return out.iterator();
            }
            List<Event> events = new ArrayList<>();
            while (rows.hasNext()) {
                Row r = rows.next();
                events.add(new Event(millis(r.get(1)), r.getString(2), r.getBoolean(3)));
            }
            events.sort(ORDER);
            OpenSession current = state.exists() ? state.get() : null;
            for (Event e : events) {
                if (current != null && current.getEndMs() != null && e.tMs - current.getEndMs() > gapMs) {
                    out.add(output(key, current, "timeout"));
                    current = null;
                }
                if (current == null) {
                    current = new OpenSession();
                }
                current.add(e.tMs, e.data);
                if (e.last) {
                    out.add(output(key, current, "last_event"));
                    current = null;
                }
            }
            if (current == null) {
                if (state.exists()) {
                    state.remove();
                }
            } else {
                state.update(current);
                state.setTimeoutTimestamp(Math.max(current.getEndMs() + gapMs, state.getCurrentWatermarkMs()));
            }
            return out.iterator();
        };
    }

    /** Sessionize {@code events} (see the class comment) with a session gap of {@code gapMs}. */
    public static Dataset<Row> apply(Dataset<Row> events, long gapMs) {
        String keyColumn = events.schema().fields()[0].name();
        return events
                .groupByKey((MapFunction<Row, String>) r -> r.getString(0), Encoders.STRING())
                .flatMapGroupsWithState(sessionizer(gapMs), OutputMode.Append(),
                        Encoders.bean(OpenSession.class), Encoders.row(outputSchema(keyColumn)),
                        GroupStateTimeout.EventTimeTimeout());
    }
}
