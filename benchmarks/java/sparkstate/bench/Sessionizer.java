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
 *   <li>a key's pending events (those of its open sessions, the state) and the batch's are
 *       ordered by event time, an unflagged event before a flagged one at equal times, then by
 *       data (null first);</li>
 *   <li>they are split after an {@code is_last} event ("last_event") and where the next event
 *       is more than {@code gap} later ("timeout");</li>
 *   <li>the leading sessions that are final are emitted: the watermark has reached the end
 *       (closed by a flag) or passed end + gap; the rest stay in the state, timing out when the first of
 *       them becomes final.</li>
 * </ul>
 *
 * Input rows are {@code (key string, event_time timestamp, data string, is_last boolean)}, with
 * the watermark already defined and null event times filtered out (as sessionize does).
 * Output: {@code key, session_start, session_end, event_count, events, closed_by}.
 */
public final class Sessionizer {

    private Sessionizer() {
    }

    /** The state of one key: the events of its open sessions (epoch ms). A Java bean for {@code Encoders.bean}. */
    public static class OpenSessions implements Serializable {
        private static final long serialVersionUID = 1L;
        private List<Long> times = new ArrayList<>();
        private List<Boolean> lasts = new ArrayList<>();
        private List<String> events = new ArrayList<>();

        public OpenSessions() {
        }

        public List<Long> getTimes() {
            return times;
        }

        public void setTimes(List<Long> times) {
            this.times = times;
        }

        public List<Boolean> getLasts() {
            return lasts;
        }

        public void setLasts(List<Boolean> lasts) {
            this.lasts = lasts;
        }

        public List<String> getEvents() {
            return events;
        }

        public void setEvents(List<String> events) {
            this.events = events;
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
            Comparator.<Event>comparingLong(e -> e.tMs).thenComparing(e -> e.last)
                    .thenComparing(e -> e.data, Comparator.nullsFirst(Comparator.<String>naturalOrder()));

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

    private static Row output(String key, List<Event> s) {
        String[] events = new String[s.size()];
        for (int i = 0; i < events.length; i++) {
            events[i] = s.get(i).data;
        }
        Event last = s.get(s.size() - 1);
        return RowFactory.create(key, new Timestamp(s.get(0).tMs), new Timestamp(last.tMs), (long) events.length,
                events, last.last ? "last_event" : "timeout");
    }

    private static FlatMapGroupsWithStateFunction<String, Row, OpenSessions, Row> sessionizer(long gapMs,
                                                                                             boolean emitOnLast) {
        return (key, rows, state) -> {
            List<Event> events = new ArrayList<>();
            if (state.exists()) {
                OpenSessions stored = state.get();
                for (int i = 0; i < stored.getTimes().size(); i++) {
                    events.add(new Event(stored.getTimes().get(i), stored.getEvents().get(i), stored.getLasts().get(i)));
                }
            }
            while (rows.hasNext()) {
                Row r = rows.next();
                events.add(new Event(millis(r.get(1)), r.getString(2), r.getBoolean(3)));
            }
            events.sort(ORDER);
            List<List<Event>> sessions = new ArrayList<>();
            List<Event> current = null;
            for (Event e : events) {
                if (current == null || current.get(current.size() - 1).last
                        || e.tMs - current.get(current.size() - 1).tMs > gapMs) {
                    current = new ArrayList<>();
                    sessions.add(current);
                }
                current.add(e);
            }
            long watermark = state.getCurrentWatermarkMs();
            // Final sessions are emitted, the others kept (without emitOnLast the final ones are
            // the leading ones: a later session ends later).
            List<Row> out = new ArrayList<>();
            List<List<Event>> open = new ArrayList<>();
            for (List<Event> s : sessions) {
                if (finalAt(s, gapMs, emitOnLast) < watermark) {
                    out.add(output(key, s));
                } else {
                    open.add(s);
                }
            }
            if (open.isEmpty()) {
                if (state.exists()) {
                    state.remove();
                }
                return out.iterator();
            }
            OpenSessions rest = new OpenSessions();
            for (List<Event> s : open) {
                for (Event e : s) {
                    rest.getTimes().add(e.tMs);
                    rest.getLasts().add(e.last);
                    rest.getEvents().add(e.data);
                }
            }
            state.update(rest);
            state.setTimeoutTimestamp(finalAt(open.get(0), gapMs, false));
            return out.iterator();
        };
    }

    /**
     * The session is final once the watermark is past this: end - 1 (closed by a flag) or end + gap;
     * with {@code emitOnLast}, a session closed by a flag is final at once (as sessionize's
     * {@code emit_on_last=True}: each key's events arrive in event-time order).
     */
    private static long finalAt(List<Event> s, long gapMs, boolean emitOnLast) {
        Event last = s.get(s.size() - 1);
        if (last.last) {
            return emitOnLast ? Long.MIN_VALUE : last.tMs - 1;
        }
        return last.tMs + gapMs;
    }

    /** Sessionize {@code events} (see the class comment) with a session gap of {@code gapMs}. */
    public static Dataset<Row> apply(Dataset<Row> events, long gapMs) {
        return apply(events, gapMs, false);
    }

    /** The same; with {@code emitOnLast}, a session ending with an is_last event is emitted in the batch that reads it. */
    public static Dataset<Row> apply(Dataset<Row> events, long gapMs, boolean emitOnLast) {
        String keyColumn = events.schema().fields()[0].name();
        return events
                .groupByKey((MapFunction<Row, String>) r -> r.getString(0), Encoders.STRING())
                .flatMapGroupsWithState(sessionizer(gapMs, emitOnLast), OutputMode.Append(),
                        Encoders.bean(OpenSessions.class), Encoders.row(outputSchema(keyColumn)),
                        GroupStateTimeout.EventTimeTimeout());
    }
}
