package sparkstate.bench;

import org.apache.spark.api.java.function.MapFunction;
import org.apache.spark.api.java.function.MapGroupsWithStateFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.KeyValueGroupedDataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.streaming.GroupStateTimeout;

import scala.Tuple2;

/**
 * The JVM reference for the running-count workload: {@code mapGroupsWithState} with a
 * {@code Long} state per key, one output row {@code (key, count)} per key and micro-batch.
 *
 * Called from the Python benchmark through py4j with the streaming input's Dataset; the
 * result is wrapped back into a PySpark DataFrame and written to the noop sink.
 */
public final class RunningCount {

    private RunningCount() {
    }

    private static MapGroupsWithStateFunction<String, Row, Long, Tuple2<String, Long>> counter() {
        return (key, rows, state) -> {
            long n = 0;
            while (rows.hasNext()) {
                rows.next();
                n++;
            }
            long total = n + (state.exists() ? state.get() : 0L);
            state.update(total);
            return new Tuple2<>(key, total);
        };
    }

    private static KeyValueGroupedDataset<String, Row> byKey(Dataset<Row> events, String keyColumn) {
        final int idx = events.schema().fieldIndex(keyColumn);
        return events.groupByKey((MapFunction<Row, String>) r -> r.getString(idx), Encoders.STRING());
    }

    /** Running count of {@code events} per {@code keyColumn} (a string column). */
    public static Dataset<Row> apply(Dataset<Row> events, String keyColumn) {
        return byKey(events, keyColumn)
                .mapGroupsWithState(counter(), Encoders.LONG(),
                        Encoders.tuple(Encoders.STRING(), Encoders.LONG()), GroupStateTimeout.NoTimeout())
                .toDF(keyColumn, "count");
    }

    /**
     * The same, starting from {@code initial}: a static Dataset of {@code (key string, count long)}
     * rows, loaded into the state store by the first micro-batch (the state-size scaling run).
     */
    public static Dataset<Row> withInitialState(Dataset<Row> events, String keyColumn, Dataset<Row> initial) {
        KeyValueGroupedDataset<String, Long> init = initial
                .map((MapFunction<Row, Tuple2<String, Long>>) r -> new Tuple2<>(r.getString(0), r.getLong(1)),
                        Encoders.tuple(Encoders.STRING(), Encoders.LONG()))
                .groupByKey((MapFunction<Tuple2<String, Long>, String>) Tuple2::_1, Encoders.STRING())
                .mapValues((MapFunction<Tuple2<String, Long>, Long>) Tuple2::_2, Encoders.LONG());
        return byKey(events, keyColumn)
                .mapGroupsWithState(counter(), Encoders.LONG(),
                        Encoders.tuple(Encoders.STRING(), Encoders.LONG()), GroupStateTimeout.NoTimeout(), init)
                .toDF(keyColumn, "count");
    }
}
