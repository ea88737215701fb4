package io.hl7gw.fhir;

import ca.uhn.fhir.context.FhirContext;
import ca.uhn.fhir.context.support.DefaultProfileValidationSupport;
import ca.uhn.fhir.context.support.IValidationSupport;
import ca.uhn.fhir.validation.FhirValidator;
import java.io.IOException;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.Proxy;
import java.net.ProxySelector;
import java.net.SocketAddress;
import java.net.URI;
import java.util.List;
import java.util.concurrent.atomic.AtomicLong;
import org.hl7.fhir.common.hapi.validation.support.CommonCodeSystemsTerminologyService;
import org.hl7.fhir.common.hapi.validation.support.InMemoryTerminologyServerValidationSupport;
import org.hl7.fhir.common.hapi.validation.support.SnapshotGeneratingValidationSupport;
import org.hl7.fhir.common.hapi.validation.support.UnknownCodeSystemWarningValidationSupport;
import org.hl7.fhir.common.hapi.validation.support.ValidationSupportChain;
import org.hl7.fhir.common.hapi.validation.validator.FhirInstanceValidator;

/**
 * HAPI's R4 validator, offline: the core definitions of hapi-fhir-validation-resources-r4, in-memory terminology
 * (the code systems and value sets of the core spec, plus the common ones HAPI knows: UCUM, BCP-47, MIME types,
 * ISO 3166/4217, USPS), snapshots generated locally. No terminology server and no package download are
 * configured; a code system none of these knows (LOINC, SNOMED CT, local ones) is reported as a warning instead
 * of being looked up.
 */
final class Offline {
    private Offline() {}

    /** Connections to anything but the loopback range that some library tried (each is also logged to stderr). */
    static final AtomicLong NETWORK_ATTEMPTS = new AtomicLong();

    static FhirContext context() {
        return FhirContext.forR4Cached();
    }

    static IValidationSupport supportChain(FhirContext ctx) {
        UnknownCodeSystemWarningValidationSupport unknown = new UnknownCodeSystemWarningValidationSupport(ctx);
        unknown.setNonExistentCodeSystemSeverity(IValidationSupport.IssueSeverity.WARNING);
        // The chain caches lookups itself (HAPI 8: CachingValidationSupport is folded into it).
        return new ValidationSupportChain(
                new DefaultProfileValidationSupport(ctx),
                new CommonCodeSystemsTerminologyService(ctx),
                new InMemoryTerminologyServerValidationSupport(ctx),
                new SnapshotGeneratingValidationSupport(ctx),
                unknown);
    }

    static FhirValidator validator(FhirContext ctx) {
        FhirInstanceValidator module = new FhirInstanceValidator(supportChain(ctx));
        module.setAnyExtensionsAllowed(true);
        FhirValidator v = ctx.newValidator();
        v.setValidateAgainstStandardSchema(false);
        v.setValidateAgainstStandardSchematron(false);
        v.registerValidatorModule(module);
        return v;
    }

    /**
     * Any HTTP(S) connection the JDK's clients would open to a host outside 127.0.0.0/8 and ::1 is sent to a dead
     * proxy (127.0.0.1:9, refused at once) and logged: nothing here may use the network, and a lookup would hang
     * or fail slowly on a machine without one. Clients that bypass the default ProxySelector are not covered;
     * README.md says how the self-check runs the validator without a network at all.
     */
    static void guardNetwork() {
        ProxySelector.setDefault(new ProxySelector() {
            @Override
            public List<Proxy> select(URI uri) {
                String host = uri.getHost();
                if (host == null || isLoopback(host)) {
                    return List.of(Proxy.NO_PROXY);
                }
                NETWORK_ATTEMPTS.incrementAndGet();
                System.err.println("fhir-harness: network access refused (offline harness): " + uri);
                return List.of(new Proxy(Proxy.Type.HTTP, new InetSocketAddress("127.0.0.1", 9)));
            }

            @Override
            public void connectFailed(URI uri, SocketAddress sa, IOException ioe) {}
        });
    }

    static boolean isLoopback(String host) {
        if (host.equals("localhost")) {
            return true;
        }
        if (!host.matches("[0-9.]+|\\[?[0-9a-fA-F:]+\\]?")) {
            return false; // a name: not resolved here (resolving it would be a network access itself)
        }
        try {
            return InetAddress.getByName(host.replace("[", "").replace("]", "")).isLoopbackAddress();
        } catch (IOException e) {
            return false;
        }
    }
}
