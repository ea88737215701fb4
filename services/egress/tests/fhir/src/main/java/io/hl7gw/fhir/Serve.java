package io.hl7gw.fhir;

import ca.uhn.fhir.context.FhirContext;
import ca.uhn.fhir.rest.api.EncodingEnum;
import ca.uhn.fhir.rest.server.FifoMemoryPagingProvider;
import ca.uhn.fhir.rest.server.IResourceProvider;
import ca.uhn.fhir.rest.server.RestfulServer;
import ca.uhn.fhir.rest.server.interceptor.RequestValidatingInterceptor;
import ca.uhn.fhir.validation.FhirValidator;
import ca.uhn.fhir.validation.ResultSeverityEnum;
import jakarta.servlet.DispatcherType;
import java.net.InetAddress;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.PublicKey;
import java.util.ArrayList;
import java.util.EnumSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import org.eclipse.jetty.ee10.servlet.FilterHolder;
import org.eclipse.jetty.ee10.servlet.ServletContextHandler;
import org.eclipse.jetty.ee10.servlet.ServletHolder;
import org.eclipse.jetty.alpn.server.ALPNServerConnectionFactory;
import org.eclipse.jetty.http2.server.HTTP2CServerConnectionFactory;
import org.eclipse.jetty.http2.server.HTTP2ServerConnectionFactory;
import org.eclipse.jetty.server.HttpConfiguration;
import org.eclipse.jetty.server.HttpConnectionFactory;
import org.eclipse.jetty.server.LocalConnector;
import org.eclipse.jetty.server.SecureRequestCustomizer;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;
import org.eclipse.jetty.server.SslConnectionFactory;
import org.eclipse.jetty.util.ssl.SslContextFactory;
import org.eclipse.jetty.util.thread.QueuedThreadPool;

/**
 * `serve --port P [--bind 127.0.0.1]`: HAPI's RestfulServer at /fhir (every R4 resource type, in memory,
 * requests validated on write), the test controls at /admin, on Jetty 12 (HTTP/1.1 and h2c) on a loopback
 * address only. Prints `fhir-server listening port=P` once it answers. With --tls-cert/--tls-key: HTTPS
 * (HTTP/1.1 and h2 by ALPN) instead, --client-ca requiring client certificates; --bearer-token-file and
 * --smart-client (SMART Backend Services, token endpoint /auth/token) require a bearer token on /fhir (Auth).
 */
final class Serve {
    private Serve() {}

    /** The types the issue names: /admin/counts always lists them, 0 included. */
    static final Set<String> LISTED = new TreeSet<>(List.of("Patient", "Encounter", "RelatedPerson",
            "AllergyIntolerance", "Condition", "Coverage", "Observation", "DiagnosticReport", "Specimen",
            "ServiceRequest", "Practitioner", "Organization", "Location", "Immunization", "DocumentReference",
            "Appointment", "MessageHeader", "Provenance"));

    /**
     * The types served unless --types says otherwise: those above and the others the v2-to-FHIR IG's maps
     * produce or a route may plausibly send. Each type served costs HAPI start-up time (all 146: ~10 s more).
     */
    static final Set<String> DEFAULT_TYPES = new TreeSet<>(List.of("Account", "Binary", "Bundle", "CarePlan",
            "Communication", "Composition", "Consent", "Device", "Endpoint", "EpisodeOfCare",
            "FamilyMemberHistory", "HealthcareService", "ImmunizationRecommendation", "Medication",
            "MedicationAdministration", "MedicationDispense", "MedicationRequest", "MedicationStatement",
            "PractitionerRole", "Procedure", "Schedule", "Slot", "Task"));

    static {
        DEFAULT_TYPES.addAll(LISTED);
    }

    static void run(String[] args) throws Exception {
        long t0 = System.nanoTime();
        int port = -1;
        String bind = "127.0.0.1";
        String types = "default";
        Path tlsCert = null;
        Path tlsKey = null;
        Path clientCa = null;
        String bearer = null;
        Map<String, List<PublicKey>> smartClients = new LinkedHashMap<>();
        long ttl = 300;
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--port" -> port = Integer.parseInt(value(args, ++i));
                case "--bind" -> bind = value(args, ++i);
                case "--types" -> types = value(args, ++i);
                case "--tls-cert" -> tlsCert = Path.of(value(args, ++i));
                case "--tls-key" -> tlsKey = Path.of(value(args, ++i));
                case "--client-ca" -> clientCa = Path.of(value(args, ++i));
                case "--bearer-token-file" -> {
                    bearer = Files.readString(Path.of(value(args, ++i))).trim();
                    if (bearer.isEmpty()) {
                        System.err.println("fhir-harness: --bearer-token-file: the file is empty");
                        System.exit(2);
                    }
                }
                case "--smart-client" -> Auth.addClient(smartClients, value(args, ++i));
                case "--token-ttl-seconds" -> ttl = Long.parseLong(value(args, ++i));
                default -> Main.usage();
            }
        }
        if (port < 0 || port > 65535 || ttl < 1 || (tlsCert == null) != (tlsKey == null)
                || (clientCa != null && tlsCert == null)) {
            System.err.println("fhir-harness: --tls-cert and --tls-key go together, --client-ca needs them,"
                    + " --token-ttl-seconds >= 1");
            Main.usage();
        }
        boolean tls = tlsCert != null;
        Auth auth = new Auth(bearer, smartClients, ttl, tls, clientCa != null);
        if (!bind.matches("[0-9.]+|[0-9a-fA-F:]+") || !InetAddress.getByName(bind).isLoopbackAddress()) {
            System.err.println("fhir-harness: --bind takes a loopback address (127.0.0.0/8 or ::1), not " + bind);
            System.exit(2);
        }

        FhirContext ctx = Offline.context();
        FhirValidator validator = Offline.validator(ctx);
        Set<String> served = new TreeSet<>();
        for (String t : types.split(",")) {
            switch (t.trim()) {
                case "" -> {}
                case "all" -> served.addAll(ctx.getResourceTypes());
                case "default" -> served.addAll(DEFAULT_TYPES);
                default -> {
                    if (!ctx.getResourceTypes().contains(t.trim())) {
                        System.err.println("fhir-harness: --types: no R4 resource type " + t.trim());
                        System.exit(2);
                    }
                    served.add(t.trim());
                }
            }
        }
        Store store = new Store(ctx, served);
        Admin admin = new Admin(store, auth);

        RestfulServer fhir = new RestfulServer(ctx);
        List<IResourceProvider> providers = new ArrayList<>();
        for (String type : served) {
            providers.add(new TypeProvider(ctx.getResourceDefinition(type).getImplementingClass(), type, store));
        }
        fhir.setResourceProviders(providers);
        fhir.registerProvider(new SystemProvider(store));
        fhir.setDefaultResponseEncoding(EncodingEnum.JSON);
        FifoMemoryPagingProvider paging = new FifoMemoryPagingProvider(100);
        paging.setDefaultPageSize(50);
        paging.setMaximumPageSize(1000);
        fhir.setPagingProvider(paging);
        RequestValidatingInterceptor validating = new RequestValidatingInterceptor();
        validating.setValidator(validator);
        validating.setFailOnSeverity(ResultSeverityEnum.ERROR);
        validating.setAddResponseHeaderOnSeverity(null);
        validating.setAddValidationResultsToResponseOperationOutcome(true);
        fhir.registerInterceptor(new BodySyntaxCheck());
        fhir.registerInterceptor(validating);

        QueuedThreadPool threads = new QueuedThreadPool(64, 4);
        threads.setName("fhir-harness");
        Server server = new Server(threads);
        HttpConfiguration http = new HttpConfiguration();
        http.setSendServerVersion(false);
        http.setSendDateHeader(true);
        ServerConnector connector;
        if (tls) {
            // HTTPS: TLS (the JDK's provider), then ALPN choosing h2 or http/1.1 (the default without ALPN).
            HttpConfiguration https = new HttpConfiguration(http);
            SecureRequestCustomizer secure = new SecureRequestCustomizer();
            secure.setSniHostCheck(false); // the client checks the certificate's name; 127.0.0.1 has no SNI
            https.addCustomizer(secure);
            SslContextFactory.Server ssl = new SslContextFactory.Server();
            ssl.setSslContext(Tls.context(tlsCert, tlsKey, clientCa));
            ssl.setNeedClientAuth(clientCa != null);
            ssl.setSniRequired(false);
            HttpConnectionFactory h1 = new HttpConnectionFactory(https);
            ALPNServerConnectionFactory alpn = new ALPNServerConnectionFactory("h2", "http/1.1");
            alpn.setDefaultProtocol(h1.getProtocol());
            connector = new ServerConnector(server, new SslConnectionFactory(ssl, alpn.getProtocol()), alpn,
                    new HTTP2ServerConnectionFactory(https), h1);
            connector.addBean(auth.handshakeListener());
        } else {
            connector = new ServerConnector(server, new HttpConnectionFactory(http),
                    new HTTP2CServerConnectionFactory(http));
        }
        connector.setHost(bind);
        connector.setPort(port);
        server.addConnector(connector);
        // In-memory requests for the warm-up below when the port speaks TLS (and perhaps wants a client
        // certificate); not reachable from outside.
        LocalConnector local = new LocalConnector(server, new HttpConnectionFactory(http));
        if (tls) {
            server.addConnector(local);
        }
        ServletContextHandler context = new ServletContextHandler();
        context.setContextPath("/");
        ServletHolder fhirHolder = new ServletHolder("fhir", fhir);
        fhirHolder.setInitOrder(1);
        context.addServlet(fhirHolder, "/fhir/*");
        context.addServlet(new ServletHolder("admin", admin.servlet()), "/admin/*");
        context.addServlet(new ServletHolder("smart-configuration", auth.wellKnownServlet()), "/fhir/.well-known/*");
        context.addServlet(new ServletHolder("token", auth.tokenServlet()), "/auth/*");
        context.addFilter(new FilterHolder(admin.logFilter()), "/fhir/*", EnumSet.of(DispatcherType.REQUEST));
        context.addFilter(new FilterHolder(auth.fhirFilter()), "/fhir/*", EnumSet.of(DispatcherType.REQUEST));
        context.addFilter(new FilterHolder(admin.failFilter()), "/fhir/*", EnumSet.of(DispatcherType.REQUEST));
        server.setHandler(context);
        server.setStopAtShutdown(true);
        long tSetup = System.nanoTime();
        server.start();
        int actual = connector.getLocalPort();
        long tStarted = System.nanoTime();

        // Warm up (the first validation loads and indexes the core definitions: seconds), so that the tests'
        // first request is not the slow one: the validator directly, then HAPI's own paths over HTTP.
        validator.validateWithResult(Warmup.BUNDLE);
        long tValidator = System.nanoTime();
        String base = (tls ? "https://" : "http://") + (bind.contains(":") ? "[" + bind + "]" : bind) + ":" + actual
                + "/fhir";
        if (tls) {
            for (String path : List.of("/fhir/metadata", "/fhir/Patient?identifier=urn:warmup%7C0&_count=1")) {
                local.getResponse("GET " + path + " HTTP/1.1\r\nHost: localhost\r\n" + Admin.WARMUP_HEADER
                        + ": 1\r\nConnection: close\r\n\r\n");
            }
        } else {
            HttpClient client = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).build();
            client.send(HttpRequest.newBuilder(URI.create(base + "/metadata")).header(Admin.WARMUP_HEADER, "1")
                    .build(), HttpResponse.BodyHandlers.discarding());
            client.send(HttpRequest.newBuilder(URI.create(base + "/Patient?identifier=urn:warmup%7C0&_count=1"))
                    .header(Admin.WARMUP_HEADER, "1").build(), HttpResponse.BodyHandlers.discarding());
        }
        admin.reset();
        admin.startLogging();
        auth.enforce();

        System.out.println("fhir-server listening port=" + actual + (tls ? " scheme=https" : ""));
        System.out.flush();
        long tReady = System.nanoTime();
        System.err.printf("fhir-harness: %s ready in %d ms (%d resource types; setup %d ms, Jetty and HAPI's"
                + " RestfulServer %d ms, the validator's first run %d ms, the first requests %d ms)%n", base,
                (tReady - t0) / 1_000_000, providers.size(), (tSetup - t0) / 1_000_000,
                (tStarted - tSetup) / 1_000_000, (tValidator - tStarted) / 1_000_000,
                (tReady - tValidator) / 1_000_000);
        server.join();
    }

    private static String value(String[] args, int i) {
        if (i >= args.length) {
            Main.usage();
        }
        return args[i];
    }
}
