package hl7gw.fhircompare;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.github.linuxforhealth.hl7.ConverterOptions;
import io.github.linuxforhealth.hl7.HL7ToFHIRConverter;
import java.io.IOException;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import org.hl7.fhir.r4.model.Bundle.BundleType;

/**
 * LinuxForHealth's HL7 v2 -> FHIR R4 converter on the given HL7 files, one thread: the time of
 * {@code HL7ToFHIRConverter.convert(String, options)} (HAPI v2 parse, the converter's templates, FHIR JSON out),
 * the same work as hl7gw-fhir's bench (parse, convert, JSON Bundle).
 *
 * <pre>
 *   java -cp 'target/classes:target/libs/*' hl7gw.fhircompare.Main [options] OUT_DIR FILE...
 *     --bundle transaction|collection|message   Bundle.type (default transaction, as our bench's first row)
 *     --warmup-seconds S   warm-up over all the messages in turn, at least S seconds (default 10)
 *     --warmup-min K       and at least K conversions (default 2000)
 *     --rounds R           measured rounds per message (default 5)
 *     --round-ms M         each round converts the message at least this long (default 1000)
 * </pre>
 *
 * Prints one line per message: µs per conversion (mean and median of the rounds, and the fastest round; wall
 * time), the process's CPU time per conversion over all rounds (all its threads: GC and JIT included, time
 * spent waiting for a core on a loaded machine not), bytes in and out, and the Bundle's resources by type; writes each message's Bundle to OUT_DIR/NAME.json. A message
 * the converter fails on is reported as such and left out of the measurement.
 */
public final class Main {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final com.sun.management.OperatingSystemMXBean OS =
      (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();

  private record Msg(String name, String text, int bytes) {}

  public static void main(String[] args) throws IOException {
    String bundle = "transaction";
    double warmupSeconds = 10;
    long warmupMin = 2000;
    int rounds = 5;
    long roundMs = 1000;
    List<String> rest = new ArrayList<>();
    for (int i = 0; i < args.length; i++) {
      switch (args[i]) {
        case "--bundle" -> bundle = args[++i];
        case "--warmup-seconds" -> warmupSeconds = Double.parseDouble(args[++i]);
        case "--warmup-min" -> warmupMin = Long.parseLong(args[++i]);
        case "--rounds" -> rounds = Integer.parseInt(args[++i]);
        case "--round-ms" -> roundMs = Long.parseLong(args[++i]);
        default -> rest.add(args[i]);
      }
    }
    if (rest.size() < 2) {
      System.err.println("usage: Main [options] OUT_DIR FILE...");
      System.exit(2);
    }
    Path out = Path.of(rest.get(0));
    Files.createDirectories(out);
    ConverterOptions options =
        new ConverterOptions.Builder()
            .withBundleType(BundleType.valueOf(bundle.toUpperCase()))
            .build();
    HL7ToFHIRConverter converter = new HL7ToFHIRConverter();

    List<Msg> messages = new ArrayList<>();
    for (String file : rest.subList(1, rest.size())) {
      Path p = Path.of(file);
      byte[] raw = Files.readAllBytes(p);
      String name = p.getFileName().toString().replaceFirst("\\.hl7$", "");
      String text = new String(raw, StandardCharsets.UTF_8);
      try {
        String bundleJson = converter.convert(text, options);
        if (bundleJson == null || bundleJson.isEmpty()) {
          throw new IllegalStateException("no Bundle (message type not supported?)");
        }
        Files.writeString(out.resolve(name + ".json"), bundleJson);
        messages.add(new Msg(name, text, raw.length));
      } catch (RuntimeException e) {
        System.out.printf("%-36s FAILED: %s%n", name, oneLine(e));
      }
    }
    if (messages.isEmpty()) {
      System.exit(1);
    }

    // Warm-up: every message in turn, until both the time and the count are reached.
    long sink = 0;
    long start = System.nanoTime();
    long done = 0;
    while (done < warmupMin || System.nanoTime() - start < (long) (warmupSeconds * 1e9)) {
      for (Msg m : messages) {
        sink += converter.convert(m.text, options).length();
        done++;
      }
    }
    System.out.printf(
        "# LinuxForHealth hl7v2-fhir-converter 1.0.19, Bundle %s, Java %s, warm-up %d conversions in %.1f s,"
            + " %d rounds of >= %d ms per message%n",
        bundle, System.getProperty("java.version"), done, (System.nanoTime() - start) / 1e9, rounds, roundMs);
    System.out.printf(
        "%-36s %9s %9s %9s %9s %9s %9s  %s%n",
        "message", "mean_us", "median_us", "best_us", "cpu_us", "bytes_in", "bytes_out", "resources");

    for (Msg m : messages) {
      // Calibrate: how many conversions fill one round.
      long t0 = System.nanoTime();
      int calib = 0;
      while (System.nanoTime() - t0 < 100_000_000L) {
        sink += converter.convert(m.text, options).length();
        calib++;
      }
      long perRound = Math.max(1, (long) (calib * (roundMs / 100.0)));
      double[] us = new double[rounds];
      long cpu0 = OS.getProcessCpuTime();
      for (int r = 0; r < rounds; r++) {
        long s = System.nanoTime();
        for (long i = 0; i < perRound; i++) {
          sink += converter.convert(m.text, options).length();
        }
        us[r] = (System.nanoTime() - s) / 1e3 / perRound;
      }
      double cpuUs = (OS.getProcessCpuTime() - cpu0) / 1e3 / (perRound * rounds);
      String bundleJson = Files.readString(out.resolve(m.name + ".json"));
      double[] sorted = us.clone();
      Arrays.sort(sorted);
      double median =
          rounds % 2 == 1 ? sorted[rounds / 2] : (sorted[rounds / 2 - 1] + sorted[rounds / 2]) / 2;
      System.out.printf(
          "%-36s %9.0f %9.0f %9.0f %9.0f %9d %9d  %s%n",
          m.name,
          Arrays.stream(us).average().orElse(0),
          median,
          sorted[0],
          cpuUs,
          m.bytes,
          bundleJson.getBytes(StandardCharsets.UTF_8).length,
          resources(bundleJson));
    }
    if (sink == 42) {
      System.out.println(); // keeps the results alive
    }
  }

  /** "11: Patient 1, Encounter 1, ..." from the Bundle's entries. */
  private static String resources(String bundleJson) throws IOException {
    JsonNode entries = JSON.readTree(bundleJson).path("entry");
    Map<String, Integer> byType = new TreeMap<>();
    for (JsonNode e : entries) {
      byType.merge(e.path("resource").path("resourceType").asText("?"), 1, Integer::sum);
    }
    StringBuilder sb = new StringBuilder().append(entries.size()).append(":");
    byType.forEach((k, v) -> sb.append(' ').append(k).append(' ').append(v).append(','));
    if (!byType.isEmpty()) {
      sb.setLength(sb.length() - 1);
    }
    return sb.toString();
  }

  private static String oneLine(Throwable e) {
    String s = e.getClass().getSimpleName() + ": " + e.getMessage();
    return s.replaceAll("\\s+", " ");
  }
}
