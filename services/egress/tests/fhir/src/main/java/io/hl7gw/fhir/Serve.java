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
import java.util.ArrayList;
import java.util.EnumSet;
import java.util.List;
import java.util.Set;
import java.util.TreeSet;
import org.eclipse.jetty.ee10.servlet.FilterHolder;
import org.eclipse.jetty.ee10.servlet.ServletContextHandler;
import org.eclipse.jetty.ee10.servlet.ServletHolder;
import org.eclipse.jetty.http2.server.HTTP2CServerConnectionFactory;
import org.eclipse.jetty.server.HttpConfiguration;
import org.eclipse.jetty.server.HttpConnectionFactory;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;
import org.eclipse.jetty.util.thread.QueuedThreadPool;

/**
 * `serve --port P [--bind 127.0.0.1]`: HAPI's RestfulServer at /fhir (every R4 resource type, in memory,
 * requests validated on write), the test controls at /admin, on Jetty 12 (HTTP/1.1 and h2c) on a loopback
 * address only. Prints `fhir-server listening port=P` once it answers.
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
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--port" -> port = Integer.parseInt(value(args, ++i));
                case "--bind" -> bind = value(args, ++i);
                case "--types" -> types = value(args, ++i);
                default -> Main.usage();
            }
        }
        if (port < 0 || port > 65535) {
            Main.usage();
        }
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
        Admin admin = new Admin(store);

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
        ServerConnector connector = new ServerConnector(server, new HttpConnectionFactory(http),
                new HTTP2CServerConnectionFactory(http));
        connector.setHost(bind);
        connector.setPort(port);
        server.addConnector(connector);
        ServletContextHandler context = new ServletContextHandler();
        context.setContextPath("/");
        ServletHolder fhirHolder = new ServletHolder("fhir", fhir);
        fhirHolder.setInitOrder(1);
        context.addServlet(fhirHolder, "/fhir/*");
        context.addServlet(new ServletHolder("admin", admin.servlet()), "/admin/*");
        context.addFilter(new FilterHolder(admin.logFilter()), "/fhir/*", EnumSet.of(DispatcherType.REQUEST));
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
        String base = "http://" + (bind.contains(":") ? "[" + bind + "]" : bind) + ":" + actual + "/fhir";
        HttpClient client = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).build();
        client.send(HttpRequest.newBuilder(URI.create(base + "/metadata")).build(), HttpResponse.BodyHandlers.discarding());
        client.send(HttpRequest.newBuilder(URI.create(base + "/Patient?identifier=urn:warmup%7C0&_count=1")).build(),
                HttpResponse.BodyHandlers.discarding());
        admin.reset();

        System.out.println("fhir-server listening port=" + actual);
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
