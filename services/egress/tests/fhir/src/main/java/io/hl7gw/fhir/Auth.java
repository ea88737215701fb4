package io.hl7gw.fhir;

import static io.hl7gw.fhir.Http.sendJson;
import static io.hl7gw.fhir.Http.sendOutcome;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.hl7gw.fhir.Http.HttpFilter;
import jakarta.servlet.http.HttpServlet;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.security.MessageDigest;
import java.security.PublicKey;
import java.security.SecureRandom;
import java.security.Signature;
import java.security.cert.Certificate;
import java.security.cert.X509Certificate;
import java.security.interfaces.ECPublicKey;
import java.security.interfaces.RSAPublicKey;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import javax.net.ssl.SSLPeerUnverifiedException;
import javax.net.ssl.SSLSession;
import org.eclipse.jetty.io.ssl.SslHandshakeListener;

/**
 * Authentication in front of /fhir: a static bearer token (--bearer-token-file) and/or SMART Backend Services
 * (--smart-client: the token endpoint POST /auth/token takes a client_credentials grant with a JWT assertion
 * signed RS384 or ES384, and issues bearer tokens), GET /fhir/.well-known/smart-configuration, and the counters
 * /admin/auth reports (TLS handshakes and client certificates included).
 */
final class Auth {
    static final String ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";
    static final long MAX_EXP_AHEAD_SECONDS = 300;
    static final int TOKEN_LOG_LIMIT = 100;
    static final List<String> TOKEN_ERRORS = List.of("invalid_request", "unsupported_grant_type", "invalid_client",
            "invalid_grant");
    static final List<String> REFUSAL_REASONS = List.of("missing", "malformed", "unknown", "expired", "revoked");

    private final ObjectMapper json = new ObjectMapper();
    private final SecureRandom random = new SecureRandom();
    private final String staticToken;
    private final Map<String, List<PublicKey>> clients;
    private final long ttlSeconds;
    private final boolean tls;
    private final boolean clientCa;
    /** False while the server warms up (its own requests), then every /fhir request is checked. */
    private volatile boolean enforcing;

    private record Issued(String clientId, String scope, long expiresAtMillis) {}

    // Issued tokens and the assertions' jti seen: kept by /admin/reset (tests sharing a server), cleared only by
    // /admin/revoke (tokens).
    private final Map<String, Issued> tokens = new ConcurrentHashMap<>();
    private final Set<String> revoked = ConcurrentHashMap.newKeySet();
    private final Set<String> jtis = new HashSet<>();

    // Counters, cleared by /admin/reset.
    private long tokenRequests;
    private long tokensIssued;
    private final Map<String, Long> tokenRefused = new TreeMap<>();
    private long revocations;
    private long fhirAuthorized;
    private final Map<String, Long> fhirRefused = new TreeMap<>();
    private long handshakes;
    private long handshakeFailures;
    private String lastHandshakeFailure;
    private long clientCertificates;
    private String lastClientCn;
    private final ArrayDeque<ObjectNode> tokenLog = new ArrayDeque<>();
    private long tokenInjected;
    // POST /admin/token-fail: the next `tokenFailCount` token requests get `tokenFailStatus`.
    private int tokenFailCount;
    private int tokenFailStatus;
    // POST /admin/smart: what a hostile or broken server would say (kept by /admin/reset, empty: the defaults):
    // the discovery document's token_endpoint, and the token answers' expires_in as a raw JSON number.
    private volatile String tokenEndpointOverride;
    private volatile String expiresInOverride;

    Auth(String staticToken, Map<String, List<PublicKey>> clients, long ttlSeconds, boolean tls, boolean clientCa) {
        this.staticToken = staticToken;
        this.clients = clients;
        this.ttlSeconds = ttlSeconds;
        this.tls = tls;
        this.clientCa = clientCa;
        resetCounters();
    }

    boolean required() {
        return staticToken != null || !clients.isEmpty();
    }

    boolean smart() {
        return !clients.isEmpty();
    }

    void enforce() {
        enforcing = true;
    }

    synchronized void resetCounters() {
        tokenRequests = 0;
        tokensIssued = 0;
        TOKEN_ERRORS.forEach(e -> tokenRefused.put(e, 0L));
        revocations = 0;
        fhirAuthorized = 0;
        REFUSAL_REASONS.forEach(r -> fhirRefused.put(r, 0L));
        handshakes = 0;
        handshakeFailures = 0;
        lastHandshakeFailure = null;
        clientCertificates = 0;
        lastClientCn = null;
        tokenLog.clear();
        tokenInjected = 0;
        tokenFailCount = 0;
    }

    synchronized ObjectNode failTokens(int status, int count) {
        if (status < 100 || status > 599 || count < 0) {
            throw new IllegalArgumentException("status must be 100-599, count >= 0");
        }
        tokenFailStatus = status;
        tokenFailCount = count;
        return json.createObjectNode().put("status", status).put("count", count);
    }

    /** POST /admin/smart?tokenEndpoint=URL&expiresIn=NUMBER (each optional; empty clears it). */
    synchronized ObjectNode smartOverrides(String tokenEndpoint, String expiresIn) {
        if (expiresIn != null && !expiresIn.isEmpty() && !expiresIn.matches("[0-9]{1,40}")) {
            throw new IllegalArgumentException("expiresIn must be digits");
        }
        tokenEndpointOverride = tokenEndpoint == null || tokenEndpoint.isEmpty() ? null : tokenEndpoint;
        expiresInOverride = expiresIn == null || expiresIn.isEmpty() ? null : expiresIn;
        return json.createObjectNode().put("tokenEndpoint", tokenEndpointOverride).put("expiresIn", expiresInOverride);
    }

    synchronized ObjectNode revoke() {
        int n = 0;
        for (String t : tokens.keySet()) {
            if (revoked.add(t)) {
                n++;
            }
        }
        revocations++;
        return json.createObjectNode().put("revoked", n);
    }

    synchronized ObjectNode status() {
        ObjectNode o = json.createObjectNode();
        o.put("tls", tls);
        o.put("clientCa", clientCa);
        o.put("bearerTokenFile", staticToken != null);
        ArrayNode c = o.putArray("smartClients");
        clients.keySet().forEach(c::add);
        o.put("tokenTtlSeconds", ttlSeconds);
        o.put("tokenRequests", tokenRequests);
        o.put("tokensIssued", tokensIssued);
        o.put("tokenRequestsFailedByInjection", tokenInjected);
        long refused = tokenRefused.values().stream().mapToLong(Long::longValue).sum();
        o.put("tokenRequestsRefused", refused);
        o.set("tokenRequestsRefusedBy", json.valueToTree(tokenRefused));
        long now = System.currentTimeMillis();
        o.put("tokensValid", tokens.entrySet().stream()
                .filter(e -> !revoked.contains(e.getKey()) && e.getValue().expiresAtMillis > now).count());
        o.put("revocations", revocations);
        o.put("fhirAuthorized", fhirAuthorized);
        o.put("fhirUnauthorized", fhirRefused.values().stream().mapToLong(Long::longValue).sum());
        o.set("fhirUnauthorizedBy", json.valueToTree(fhirRefused));
        o.put("tlsHandshakes", handshakes);
        o.put("tlsHandshakeFailures", handshakeFailures);
        o.put("lastTlsHandshakeFailure", lastHandshakeFailure);
        o.put("tlsClientCertificates", clientCertificates);
        o.put("lastClientCertificateCn", lastClientCn);
        ArrayNode log = o.putArray("tokenLog");
        tokenLog.forEach(log::add);
        return o;
    }

    /** Counts TLS handshakes, their failures (a missing or untrusted client certificate) and client certificates. */
    SslHandshakeListener handshakeListener() {
        return new SslHandshakeListener() {
            @Override
            public void handshakeSucceeded(Event event) {
                String cn = null;
                try {
                    SSLSession s = event.getSSLEngine().getSession();
                    Certificate[] peer = s.getPeerCertificates();
                    if (peer.length > 0) {
                        cn = Tls.cn(peer[0]);
                    }
                } catch (SSLPeerUnverifiedException e) {
                    // no client certificate
                }
                synchronized (Auth.this) {
                    handshakes++;
                    if (cn != null) {
                        clientCertificates++;
                        lastClientCn = cn;
                    }
                }
            }

            @Override
            public void handshakeFailed(Event event, Throwable failure) {
                synchronized (Auth.this) {
                    handshakeFailures++;
                    lastHandshakeFailure = failure.getClass().getSimpleName() + ": " + failure.getMessage();
                }
            }
        };
    }

    /** The CN of the request's client certificate (mutual TLS), or null. */
    static String clientCn(HttpServletRequest req) {
        Object certs = req.getAttribute("jakarta.servlet.request.X509Certificate");
        if (certs instanceof X509Certificate[] a && a.length > 0) {
            return Tls.cn(a[0]);
        }
        return null;
    }

    // ---- /fhir: the bearer token ----

    /** In front of /fhir (after the request log): 401 with an OperationOutcome unless a valid bearer token is sent. */
    HttpFilter fhirFilter() {
        return (req, resp, chain) -> {
            if (!required() || !enforcing || req.getRequestURI().startsWith("/fhir/.well-known/")) {
                chain.doFilter(req, resp);
                return;
            }
            String refusal = check(req.getHeader("Authorization"));
            synchronized (Auth.this) {
                if (refusal == null) {
                    fhirAuthorized++;
                } else {
                    fhirRefused.merge(refusal, 1L, Long::sum);
                }
            }
            if (refusal == null) {
                chain.doFilter(req, resp);
                return;
            }
            String description = switch (refusal) {
                case "missing" -> "no Authorization header";
                case "malformed" -> "the Authorization header is not 'Bearer <token>'";
                case "unknown" -> "unknown bearer token";
                case "expired" -> "the bearer token has expired";
                default -> "the bearer token was revoked (POST /admin/revoke)";
            };
            resp.setHeader("WWW-Authenticate", refusal.equals("missing") ? "Bearer realm=\"fhir\""
                    : "Bearer realm=\"fhir\", error=\"invalid_token\", error_description=\"" + description + "\"");
            sendOutcome(resp, 401, "login", "401 Unauthorized: " + description);
        };
    }

    /** null when the header carries a valid token, else why not (one of REFUSAL_REASONS). */
    private String check(String header) {
        if (header == null) {
            return "missing";
        }
        if (header.length() < 8 || !header.regionMatches(true, 0, "Bearer ", 0, 7) || header.substring(7).isBlank()) {
            return "malformed";
        }
        String token = header.substring(7).trim();
        if (staticToken != null && MessageDigest.isEqual(token.getBytes(StandardCharsets.UTF_8),
                staticToken.getBytes(StandardCharsets.UTF_8))) {
            return null;
        }
        Issued issued = tokens.get(token);
        if (issued == null) {
            return "unknown";
        }
        if (revoked.contains(token)) {
            return "revoked";
        }
        if (issued.expiresAtMillis <= System.currentTimeMillis()) {
            return "expired";
        }
        return null;
    }

    // ---- SMART: the discovery document and the token endpoint ----

    /** GET /fhir/.well-known/smart-configuration (no authentication). */
    HttpServlet wellKnownServlet() {
        return new HttpServlet() {
            @Override
            protected void service(HttpServletRequest req, HttpServletResponse resp) throws IOException {
                if (!smart() || !"/smart-configuration".equals(req.getPathInfo()) || !"GET".equals(req.getMethod())) {
                    sendJson(resp, 404, json.createObjectNode().put("error", smart()
                            ? "only GET /fhir/.well-known/smart-configuration"
                            : "SMART is off (serve --smart-client ID=PUBLIC-KEY.pem turns it on)"));
                    return;
                }
                ObjectNode o = json.createObjectNode();
                String endpoint = tokenEndpointOverride;
                o.put("token_endpoint", endpoint != null ? endpoint : base(req) + "/auth/token");
                o.putArray("token_endpoint_auth_methods_supported").add("private_key_jwt");
                o.putArray("token_endpoint_auth_signing_alg_values_supported").add("RS384").add("ES384");
                o.putArray("grant_types_supported").add("client_credentials");
                o.putArray("capabilities").add("client-confidential-asymmetric");
                sendJson(resp, 200, o);
            }
        };
    }

    /** scheme://host:port as the client addressed the request (its Host header or :authority). */
    private static String base(HttpServletRequest req) {
        String url = req.getRequestURL().toString();
        return url.substring(0, url.length() - req.getRequestURI().length());
    }

    private static final class TokenError extends Exception {
        final int status;
        final String error;

        TokenError(int status, String error, String description) {
            super(description, null, false, false);
            this.status = status;
            this.error = error;
        }
    }

    /** POST /auth/token. */
    HttpServlet tokenServlet() {
        return new HttpServlet() {
            @Override
            protected void service(HttpServletRequest req, HttpServletResponse resp) throws IOException {
                if (!smart() || !"/token".equals(req.getPathInfo())) {
                    sendJson(resp, 404, json.createObjectNode().put("error", "not_found").put("error_description",
                            smart() ? "the token endpoint is POST /auth/token"
                            : "SMART is off (serve --smart-client ID=PUBLIC-KEY.pem turns it on)"));
                    return;
                }
                ObjectNode entry = json.createObjectNode();
                entry.put("at", System.currentTimeMillis());
                int injected = 0;
                synchronized (Auth.this) {
                    if (tokenFailCount > 0) {
                        tokenFailCount--;
                        injected = tokenFailStatus;
                        tokenRequests++;
                        tokenInjected++;
                        entry.put("status", injected).put("error", "injected by POST /admin/token-fail");
                        tokenLog.addLast(entry);
                        while (tokenLog.size() > TOKEN_LOG_LIMIT) {
                            tokenLog.removeFirst();
                        }
                    }
                }
                if (injected > 0) {
                    resp.setHeader("Cache-Control", "no-store");
                    sendJson(resp, injected, json.createObjectNode().put("error", "temporarily_unavailable")
                            .put("error_description", "injected by POST /admin/token-fail (status " + injected + ")"));
                    return;
                }
                ObjectNode body;
                int status;
                try {
                    body = token(req, entry);
                    status = 200;
                } catch (TokenError e) {
                    status = e.status;
                    body = json.createObjectNode().put("error", e.error).put("error_description", e.getMessage());
                    entry.put("error", e.error);
                    entry.put("error_description", e.getMessage());
                }
                entry.put("status", status);
                synchronized (Auth.this) {
                    tokenRequests++;
                    if (status == 200) {
                        tokensIssued++;
                    } else {
                        tokenRefused.merge(body.get("error").asText(), 1L, Long::sum);
                    }
                    tokenLog.addLast(entry);
                    while (tokenLog.size() > TOKEN_LOG_LIMIT) {
                        tokenLog.removeFirst();
                    }
                }
                resp.setHeader("Cache-Control", "no-store");
                resp.setHeader("Pragma", "no-cache");
                if (status == 405) {
                    resp.setHeader("Allow", "POST");
                }
                sendJson(resp, status, body);
            }
        };
    }

    private ObjectNode token(HttpServletRequest req, ObjectNode entry) throws TokenError {
        if (!"POST".equals(req.getMethod())) {
            throw new TokenError(405, "invalid_request", "the token endpoint takes POST, not " + req.getMethod());
        }
        String ct = req.getContentType();
        if (ct == null || !ct.toLowerCase().startsWith("application/x-www-form-urlencoded")) {
            throw new TokenError(400, "invalid_request",
                    "Content-Type must be application/x-www-form-urlencoded, not " + ct);
        }
        Map<String, String> p = new LinkedHashMap<>();
        for (Map.Entry<String, String[]> e : req.getParameterMap().entrySet()) {
            if (e.getValue().length != 1) {
                throw new TokenError(400, "invalid_request", "parameter " + e.getKey() + " repeated");
            }
            p.put(e.getKey(), e.getValue()[0]);
        }
        entry.put("grant_type", p.get("grant_type"));
        entry.put("scope", p.get("scope"));
        String grant = p.get("grant_type");
        if (grant == null || grant.isEmpty()) {
            throw new TokenError(400, "invalid_request", "grant_type missing");
        }
        if (!grant.equals("client_credentials")) {
            throw new TokenError(400, "unsupported_grant_type", "grant_type must be client_credentials, not " + grant);
        }
        if (!ASSERTION_TYPE.equals(p.get("client_assertion_type"))) {
            throw new TokenError(400, "invalid_request", "client_assertion_type must be " + ASSERTION_TYPE + ", not "
                    + p.get("client_assertion_type"));
        }
        String assertion = p.get("client_assertion");
        if (assertion == null || assertion.isEmpty()) {
            throw new TokenError(400, "invalid_request", "client_assertion missing");
        }
        String scope = p.get("scope");
        if (scope == null || scope.isBlank()) {
            throw new TokenError(400, "invalid_request", "scope missing");
        }
        String[] parts = assertion.split("\\.", -1);
        if (parts.length != 3) {
            throw new TokenError(400, "invalid_request", "client_assertion is not a JWS in compact form (3 parts)");
        }
        JsonNode header = jsonPart(parts[0], "header");
        JsonNode claims = jsonPart(parts[1], "claims");
        String alg = header.path("alg").asText(null);
        entry.put("alg", alg);
        entry.put("kid", header.path("kid").asText(null));
        entry.put("typ", header.path("typ").asText(null));
        entry.set("claims", claims);

        // the client: iss == sub == a configured client_id, and its signature
        String iss = claims.path("iss").asText(null);
        String sub = claims.path("sub").asText(null);
        entry.put("clientId", iss);
        if (iss == null || !iss.equals(sub)) {
            throw new TokenError(401, "invalid_client", "iss (" + iss + ") and sub (" + sub + ") must be the client_id");
        }
        List<PublicKey> keys = clients.get(iss);
        if (keys == null) {
            throw new TokenError(401, "invalid_client", "unknown client " + iss + " (known: " + clients.keySet() + ")");
        }
        if (p.containsKey("client_id") && !iss.equals(p.get("client_id"))) {
            throw new TokenError(401, "invalid_client", "client_id " + p.get("client_id") + " is not the assertion's iss " + iss);
        }
        if (!"RS384".equals(alg) && !"ES384".equals(alg)) {
            throw new TokenError(401, "invalid_client", "alg must be RS384 or ES384, not " + alg);
        }
        byte[] signed = (parts[0] + "." + parts[1]).getBytes(StandardCharsets.US_ASCII);
        byte[] signature;
        try {
            signature = Base64.getUrlDecoder().decode(parts[2]);
        } catch (IllegalArgumentException e) {
            throw new TokenError(400, "invalid_request", "the signature is not base64url");
        }
        boolean typed = false;
        boolean verified = false;
        for (PublicKey key : keys) {
            String jca;
            if (alg.equals("RS384") && key instanceof RSAPublicKey) {
                jca = "SHA384withRSA";
            } else if (alg.equals("ES384") && key instanceof ECPublicKey) {
                jca = "SHA384withECDSAinP1363Format";
            } else {
                continue;
            }
            typed = true;
            if (alg.equals("ES384") && signature.length != 96) {
                continue;
            }
            try {
                Signature s = Signature.getInstance(jca);
                s.initVerify(key);
                s.update(signed);
                if (s.verify(signature)) {
                    verified = true;
                    break;
                }
            } catch (GeneralSecurityException e) {
                // not this key
            }
        }
        if (!typed) {
            throw new TokenError(401, "invalid_client", "client " + iss + " has no " + (alg.equals("RS384") ? "RSA" : "EC P-384")
                    + " key for " + alg);
        }
        if (!verified) {
            throw new TokenError(401, "invalid_client", "the signature does not verify with client " + iss + "'s "
                    + alg + " key" + (alg.equals("ES384") && signature.length != 96
                            ? " (an ES384 signature is r||s, 96 bytes; this one has " + signature.length + ")" : ""));
        }

        // the grant: aud, exp, nbf, jti
        String expected = req.getRequestURL().toString();
        JsonNode aud = claims.get("aud");
        boolean audOk = aud != null && (aud.isTextual() ? aud.asText().equals(expected)
                : aud.isArray() && java.util.stream.StreamSupport.stream(aud.spliterator(), false)
                        .anyMatch(a -> a.isTextual() && a.asText().equals(expected)));
        if (!audOk) {
            throw new TokenError(400, "invalid_grant", "aud " + aud + " is not the token endpoint " + expected);
        }
        long now = System.currentTimeMillis() / 1000;
        JsonNode exp = claims.get("exp");
        if (exp == null || !exp.isNumber()) {
            throw new TokenError(400, "invalid_grant", "exp missing or not a number");
        }
        if (exp.asLong() <= now) {
            throw new TokenError(400, "invalid_grant", "the assertion expired (exp " + exp.asLong() + ", now " + now + ")");
        }
        if (exp.asLong() > now + MAX_EXP_AHEAD_SECONDS) {
            throw new TokenError(400, "invalid_grant", "exp " + exp.asLong() + " is more than " + MAX_EXP_AHEAD_SECONDS
                    + " s ahead (now " + now + ")");
        }
        JsonNode nbf = claims.get("nbf");
        if (nbf != null && nbf.isNumber() && nbf.asLong() > now) {
            throw new TokenError(400, "invalid_grant", "nbf " + nbf.asLong() + " is in the future (now " + now + ")");
        }
        String jti = claims.path("jti").asText(null);
        if (jti == null || jti.isEmpty()) {
            throw new TokenError(400, "invalid_grant", "jti missing");
        }
        synchronized (this) {
            if (!jtis.add(iss + "\n" + jti)) {
                throw new TokenError(400, "invalid_grant", "jti " + jti + " was used before (replay)");
            }
        }

        byte[] raw = new byte[32];
        random.nextBytes(raw);
        String token = Base64.getUrlEncoder().withoutPadding().encodeToString(raw);
        tokens.put(token, new Issued(iss, scope, System.currentTimeMillis() + ttlSeconds * 1000));
        ObjectNode o = json.createObjectNode();
        o.put("access_token", token);
        o.put("token_type", "bearer");
        String expiresIn = expiresInOverride;
        if (expiresIn != null) {
            o.put("expires_in", new java.math.BigInteger(expiresIn));
        } else {
            o.put("expires_in", ttlSeconds);
        }
        o.put("scope", scope);
        return o;
    }

    private JsonNode jsonPart(String b64, String what) throws TokenError {
        try {
            JsonNode n = json.readTree(Base64.getUrlDecoder().decode(b64));
            if (n == null || !n.isObject()) {
                throw new TokenError(400, "invalid_request", "the assertion's " + what + " is not a JSON object");
            }
            return n;
        } catch (IllegalArgumentException | IOException e) {
            throw new TokenError(400, "invalid_request", "the assertion's " + what + " is not base64url JSON: "
                    + e.getMessage());
        }
    }

    /** --smart-client ID=FILE: the client's key (repeat the ID for several keys, e.g. a rotation). */
    static void addClient(Map<String, List<PublicKey>> clients, String arg) throws IOException, GeneralSecurityException {
        int eq = arg.indexOf('=');
        if (eq <= 0 || eq == arg.length() - 1) {
            throw new IllegalArgumentException("--smart-client takes CLIENT_ID=PUBLIC-KEY.pem, not " + arg);
        }
        PublicKey key = Tls.publicKey(java.nio.file.Path.of(arg.substring(eq + 1)));
        if (key instanceof ECPublicKey ec && ec.getParams().getCurve().getField().getFieldSize() != 384) {
            throw new IllegalArgumentException(arg + ": an EC key for ES384 must be on P-384, not a "
                    + ec.getParams().getCurve().getField().getFieldSize() + "-bit curve");
        }
        clients.computeIfAbsent(arg.substring(0, eq), k -> new ArrayList<>()).add(key);
    }
}
