package io.hl7gw.fhir;

import ca.uhn.fhir.context.FhirContext;
import ca.uhn.fhir.validation.FhirValidator;
import ca.uhn.fhir.validation.SingleValidationMessage;
import ca.uhn.fhir.validation.ValidationResult;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.stream.Stream;

/**
 * `validate <file-or-dir>...`: one JSON line per file on stdout,
 * {"file","errors","warnings","information","ms","messages":[{"severity","location","message"}]}; a directory
 * is walked for *.json, in name order. Exit 0 whatever was found (the caller decides); 2 on a usage error.
 */
final class Validate {
    private Validate() {}

    static int run(String[] args) throws IOException {
        if (args.length == 0) {
            Main.usage();
        }
        List<Path> files = new ArrayList<>();
        for (String a : args) {
            Path p = Path.of(a);
            if (Files.isDirectory(p)) {
                try (Stream<Path> s = Files.walk(p)) {
                    s.filter(f -> Files.isRegularFile(f) && f.getFileName().toString().endsWith(".json"))
                            .sorted()
                            .forEach(files::add);
                }
            } else {
                files.add(p);
            }
        }
        FhirContext ctx = Offline.context();
        FhirValidator validator = Offline.validator(ctx);
        ObjectMapper json = new ObjectMapper();
        PrintStream out = new PrintStream(System.out, false, StandardCharsets.UTF_8);
        for (Path f : files) {
            long t0 = System.nanoTime();
            ObjectNode line = json.createObjectNode();
            line.put("file", f.toString());
            ArrayNode messages = json.createArrayNode();
            int errors = 0, warnings = 0, information = 0;
            String text = null;
            try {
                text = Files.readString(f, StandardCharsets.UTF_8);
            } catch (IOException e) {
                errors++;
                messages.add(message(json, "error", "", "cannot read the file: " + e));
            }
            if (text != null) {
                ValidationResult result;
                try {
                    result = validator.validateWithResult(text);
                } catch (RuntimeException e) {
                    result = null;
                    errors++;
                    messages.add(message(json, "fatal", "", "the validator failed: " + e));
                }
                if (result != null) {
                    for (SingleValidationMessage m : result.getMessages()) {
                        String sev = m.getSeverity() == null ? "error" : m.getSeverity().getCode();
                        switch (sev) {
                            case "fatal", "error" -> errors++;
                            case "warning" -> warnings++;
                            default -> information++;
                        }
                        messages.add(message(json, sev, m.getLocationString(), m.getMessage()));
                    }
                }
            }
            line.put("errors", errors);
            line.put("warnings", warnings);
            line.put("information", information);
            line.put("ms", Math.round((System.nanoTime() - t0) / 1e4) / 100.0);
            line.set("messages", messages);
            out.println(json.writeValueAsString(line));
            out.flush();
        }
        if (Offline.NETWORK_ATTEMPTS.get() > 0) {
            System.err.println("fhir-harness: " + Offline.NETWORK_ATTEMPTS.get() + " network access(es) refused");
        }
        return 0;
    }

    private static ObjectNode message(ObjectMapper json, String severity, String location, String text) {
        ObjectNode m = json.createObjectNode();
        m.put("severity", severity);
        m.put("location", location == null ? "" : location);
        m.put("message", text);
        return m;
    }
}
