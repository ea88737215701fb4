package io.hl7gw.fhir;

import java.util.Arrays;

/** The harness's entry point: `validate <file-or-dir>...` or `serve --port P [--bind 127.0.0.1] [TLS, auth]`. */
public final class Main {
    private Main() {}

    public static void main(String[] args) throws Exception {
        // Quiet by default (HAPI and Jetty log at INFO otherwise); slf4j-simple writes to stderr, so stdout stays
        // the harness's own output (JSON lines, the `listening` line).
        if (System.getProperty("org.slf4j.simpleLogger.defaultLogLevel") == null) {
            System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
        }
        // Loading the R4 definitions of hapi-fhir-validation-resources-r4 warns of elements newer than R4 in a
        // few of them ('author'): not about the resources validated.
        if (System.getProperty("org.slf4j.simpleLogger.log.ca.uhn.fhir.parser.LenientErrorHandler") == null) {
            System.setProperty("org.slf4j.simpleLogger.log.ca.uhn.fhir.parser.LenientErrorHandler", "error");
        }
        Offline.guardNetwork();
        if (args.length == 0) {
            usage();
        }
        String[] rest = Arrays.copyOfRange(args, 1, args.length);
        switch (args[0]) {
            case "validate" -> System.exit(Validate.run(rest));
            case "serve" -> {
                try {
                    Serve.run(rest);
                } catch (Throwable e) {
                    e.printStackTrace();
                    System.exit(1); // Jetty's threads would keep a server that failed to start alive
                }
            }
            default -> usage();
        }
    }

    static void usage() {
        System.err.println("usage: fhir-harness validate <file-or-dir>...\n"
                + "       fhir-harness serve --port P [--bind 127.0.0.1] [--types default|all|T1,T2,...]\n"
                + "         [--tls-cert CHAIN.pem --tls-key PKCS8-KEY.pem [--client-ca CA.pem]]\n"
                + "         [--bearer-token-file FILE] [--smart-client CLIENT_ID=PUBLIC-KEY.pem]... [--token-ttl-seconds 300]\n"
                + "         (P = 0: any free port; the line `fhir-server listening port=P` says which,\n"
                + "          followed by ` scheme=https` with --tls-cert)");
        System.exit(2);
    }
}
