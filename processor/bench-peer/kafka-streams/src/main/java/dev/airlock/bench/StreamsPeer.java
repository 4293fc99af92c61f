package dev.airlock.bench;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.File;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HexFormat;
import java.util.Iterator;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.message.BinaryMessageDecoder;
import org.apache.avro.message.BinaryMessageEncoder;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * The Kafka Streams peer of airlock-bench-runtime: Airlock's decision path for refunds, as a
 * Kafka Streams application would do it. Reads Avro single-object ToolProposals keyed by
 * operation key; keeps, per operation key, the SHA-256 of the canonical arguments in a RocksDB
 * store (logged to its changelog); answers a repeated proposal DUPLICATE and a changed one
 * CONFLICT; for a fresh one writes one DispatchCommand and one Decision (Avro single-object,
 * Airlock's own schemas), under exactly_once_v2.
 *
 * <p>What it leaves out of Airlock's job: Cedar policies, the tool registry and argument
 * schemas, fences, the journal, receipts, timers. The comparison is therefore generous to it.
 *
 * <p>Usage: {@code java -jar airlock-streams-peer.jar BROKERS PREFIX SCHEMAS_DIR STATE_DIR
 * [THREADS]}: reads PREFIX + "proposals", writes PREFIX + "dispatch" and PREFIX + "decisions";
 * runs until killed (SIGTERM closes it cleanly).
 */
public final class StreamsPeer {
  private static final String STORE = "intents";
  private static final ObjectMapper JSON = new ObjectMapper();

  private StreamsPeer() {}

  public static void main(String[] args) throws Exception {
    if (args.length < 4) {
      System.err.println(
          "usage: airlock-streams-peer BROKERS PREFIX SCHEMAS_DIR STATE_DIR [THREADS]");
      System.exit(2);
    }
    String brokers = args[0];
    String prefix = args[1];
    Path schemas = Path.of(args[2]);
    String stateDir = args[3];
    int threads = args.length > 4 ? Integer.parseInt(args[4]) : 1;

    Schema proposal = parse(schemas.resolve("ToolProposal.avsc"));
    Schema decision = parse(schemas.resolve("Decision.avsc"));
    Schema dispatch = parse(schemas.resolve("DispatchCommand.avsc"));

    Topology topology = new Topology();
    topology.addSource(
        "proposals",
        Serdes.String().deserializer(),
        Serdes.ByteArray().deserializer(),
        prefix + "proposals");
    topology.addProcessor(
        "decide", () -> new Decide(proposal, decision, dispatch), "proposals");
    topology.addStateStore(
        Stores.keyValueStoreBuilder(
            Stores.persistentKeyValueStore(STORE), Serdes.String(), Serdes.ByteArray()),
        "decide");
    topology.addSink(
        "dispatch",
        prefix + "dispatch",
        Serdes.String().serializer(),
        Serdes.ByteArray().serializer(),
        "decide");
    topology.addSink(
        "decisions",
        prefix + "decisions",
        Serdes.String().serializer(),
        Serdes.ByteArray().serializer(),
        "decide");

    Properties props = new Properties();
    props.put(StreamsConfig.APPLICATION_ID_CONFIG, prefix + "streams-peer");
    props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, brokers);
    props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
    props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
    props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, threads);
    // Compression as Airlock's producer has it.
    props.put(StreamsConfig.producerPrefix("compression.type"), "lz4");
    // A single-node broker: the internal topics cannot have three replicas.
    props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);

    KafkaStreams streams = new KafkaStreams(topology, props);
    CountDownLatch done = new CountDownLatch(1);
    AtomicBoolean failed = new AtomicBoolean(false);
    streams.setStateListener(
        (now, before) -> {
          System.err.println("streams-peer: " + before + " -> " + now);
          if (now == KafkaStreams.State.ERROR) {
            failed.set(true);
          }
          if (now == KafkaStreams.State.ERROR || now == KafkaStreams.State.NOT_RUNNING) {
            done.countDown();
          }
        });
    Runtime.getRuntime()
        .addShutdownHook(
            new Thread(
                () -> {
                  streams.close(Duration.ofSeconds(10));
                  done.countDown();
                }));
    streams.start();
    done.await();
    if (failed.get()) {
      // The bench watching this process sees it gone, not a silent stall.
      streams.close(Duration.ofSeconds(10));
      System.exit(1);
    }
  }

  private static Schema parse(Path file) throws IOException {
    return new Schema.Parser().parse(new File(file.toString()));
  }

  /** Decides one proposal at a time against the store. */
  static final class Decide implements Processor<String, byte[], String, byte[]> {
    private final BinaryMessageDecoder<GenericRecord> proposals;
    private final BinaryMessageEncoder<GenericRecord> decisions;
    private final BinaryMessageEncoder<GenericRecord> dispatches;
    private final Schema decision;
    private final Schema dispatch;
    private final MessageDigest sha256;
    private ProcessorContext<String, byte[]> context;
    private KeyValueStore<String, byte[]> store;

    Decide(Schema proposal, Schema decision, Schema dispatch) {
      this.proposals = new BinaryMessageDecoder<>(GenericData.get(), proposal);
      this.decisions = new BinaryMessageEncoder<>(GenericData.get(), decision);
      this.dispatches = new BinaryMessageEncoder<>(GenericData.get(), dispatch);
      this.decision = decision;
      this.dispatch = dispatch;
      try {
        this.sha256 = MessageDigest.getInstance("SHA-256");
      } catch (NoSuchAlgorithmException e) {
        throw new IllegalStateException(e);
      }
    }

    @Override
    public void init(ProcessorContext<String, byte[]> context) {
      this.context = context;
      this.store = context.getStateStore(STORE);
    }

    @Override
    public void process(Record<String, byte[]> record) {
      GenericRecord p;
      try {
        p = proposals.decode(record.value());
      } catch (IOException | RuntimeException e) {
        return; // Not a proposal (the bench writes none such): nothing to decide.
      }
      String key = p.get("operation_key").toString();
      String canonical;
      try {
        canonical = canonical(JSON.readTree(p.get("arguments_json").toString()));
      } catch (IOException e) {
        emitDecision(record, p, "REJECTED", "ARGUMENTS_INVALID", null);
        return;
      }
      String hash =
          HexFormat.of().formatHex(sha256.digest(canonical.getBytes(StandardCharsets.UTF_8)));
      byte[] known = store.get(key);
      if (known == null) {
        store.put(key, hash.getBytes(StandardCharsets.UTF_8));
        emitDispatch(record, p, canonical, hash);
        emitDecision(record, p, "ACCEPTED", "AUTO_APPROVED", hash);
      } else if (new String(known, StandardCharsets.UTF_8).equals(hash)) {
        emitDecision(record, p, "DUPLICATE", "ATTEMPT_IN_PROGRESS", hash);
      } else {
        emitDecision(record, p, "CONFLICT", "HASH_CONFLICT", null);
      }
    }

    private void emitDispatch(
        Record<String, byte[]> in, GenericRecord p, String canonical, String hash) {
      GenericRecord d = new GenericData.Record(dispatch);
      String key = p.get("operation_key").toString();
      long now = in.timestamp();
      d.put("command_id", key + "#1");
      d.put("operation_key", key);
      d.put("epoch", 1L);
      d.put("proposal_id", p.get("proposal_id").toString());
      d.put("tool", p.get("tool").toString());
      d.put("tool_version", p.get("tool_version").toString());
      d.put("connector", "ledger");
      d.put("tenant_id", p.get("tenant_id").toString());
      d.put("principal_id", p.get("principal_id").toString());
      d.put("arguments_json", canonical);
      d.put("arguments_hash", hash);
      d.put("idempotency_key", "al1-" + hash.substring(0, 32));
      d.put("deadline_at", p.get("deadline_at"));
      d.put("attempt_deadline_at", now + 10_000L);
      d.put("attempt_timeout_ms", 10_000L);
      d.put("policy_bundle_hash", "none");
      d.put("owner_partition", context.recordMetadata().map(m -> m.partition()).orElse(-1));
      d.put("owner_epoch", 0L);
      d.put("capability", null);
      d.put("issued_at", now);
      context.forward(in.withValue(encode(dispatches, d)), "dispatch");
    }

    private void emitDecision(
        Record<String, byte[]> in, GenericRecord p, String verdict, String reason, String hash) {
      GenericRecord d = new GenericData.Record(decision);
      String proposalId = p.get("proposal_id").toString();
      d.put("decision_id", "p/" + proposalId);
      d.put("in_reply_to", proposalId);
      d.put("operation_key", p.get("operation_key").toString());
      d.put("run_id", p.get("run_id").toString());
      d.put("verdict", new GenericData.EnumSymbol(decision.getField("verdict").schema(), verdict));
      d.put("reason", new GenericData.EnumSymbol(decision.getField("reason").schema(), reason));
      d.put("detail", "");
      d.put("arguments_hash", hash);
      d.put("policy_bundle_hash", null);
      d.put("epoch", "ACCEPTED".equals(verdict) ? 1L : null);
      d.put("state", null);
      d.put("receipt", null);
      d.put("owner_partition", context.recordMetadata().map(m -> m.partition()).orElse(-1));
      d.put("owner_epoch", 0L);
      d.put("decided_at", in.timestamp());
      context.forward(in.withValue(encode(decisions, d)), "decisions");
    }

    private static byte[] encode(BinaryMessageEncoder<GenericRecord> encoder, GenericRecord r) {
      try {
        ByteBuffer buffer = encoder.encode(r);
        byte[] out = new byte[buffer.remaining()];
        buffer.get(out);
        return out;
      } catch (IOException e) {
        throw new IllegalStateException("encoding " + r.getSchema().getName(), e);
      }
    }
  }

  /**
   * Canonical JSON as Airlock's canonical form has it for the documents the bench sends: object
   * keys sorted by UTF-16 code units (Java's String order), no whitespace, integers as written.
   */
  static String canonical(JsonNode node) throws IOException {
    StringBuilder out = new StringBuilder();
    write(node, out);
    return out.toString();
  }

  private static void write(JsonNode node, StringBuilder out) throws IOException {
    if (node.isObject()) {
      List<String> names = new ArrayList<>();
      Iterator<String> it = node.fieldNames();
      it.forEachRemaining(names::add);
      Collections.sort(names);
      out.append('{');
      for (int i = 0; i < names.size(); i++) {
        if (i > 0) {
          out.append(',');
        }
        out.append(JSON.writeValueAsString(names.get(i))).append(':');
        write(node.get(names.get(i)), out);
      }
      out.append('}');
    } else if (node.isArray()) {
      out.append('[');
      for (int i = 0; i < node.size(); i++) {
        if (i > 0) {
          out.append(',');
        }
        write(node.get(i), out);
      }
      out.append(']');
    } else if (node.isFloatingPointNumber()) {
      throw new IOException("floats are not canonical");
    } else {
      out.append(JSON.writeValueAsString(node));
    }
  }
}
