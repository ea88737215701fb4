package io.hl7gw.fhir;

import static io.hl7gw.fhir.Http.sendJson;
import static io.hl7gw.fhir.Http.sendOutcome;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.hl7gw.fhir.Http.HttpFilter;
import jakarta.servlet.http.HttpServlet;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.io.IOException;
import java.util.ArrayDeque;

/**
 * The tests' controls, at /admin (outside FHIR): GET counts, POST fail, POST reset, GET requests; and the two
 * filters in front of /fhir that they drive (the request log, outermost, and the injected failures).
 */
final class Admin {
    static final int LOG_LIMIT = 10_000;

    private final Store store;
    private final Auth auth;
    private final ObjectMapper json = new ObjectMapper();
    private final ArrayDeque<ObjectNode> log = new ArrayDeque<>();
    private long logged;
    // Injected failures: the next `failCount` requests to /fhir get `failStatus` (after `failDelayMs`).
    private int failCount;
    private int failStatus;
    private String failRetryAfter;
    private long failDelayMs;
    /** False during the warm-up: its requests are not logged (read when a request starts: no race with reset). */
    private volatile boolean logging;
    /** The header the start-up's warm-up requests carry: the only ones served before `listening`. */
    static final String WARMUP_HEADER = "X-Hl7gw-Warmup";

    Admin(Store store, Auth auth) {
        this.store = store;
        this.auth = auth;
    }

    void startLogging() {
        logging = true;
    }

    synchronized void reset() {
        store.reset();
        auth.resetCounters();
        log.clear();
        logged = 0;
        failCount = 0;
    }

    HttpServlet servlet() {
        return new HttpServlet() {
            @Override
            protected void service(HttpServletRequest req, HttpServletResponse resp) throws IOException {
                String path = req.getPathInfo() == null ? "" : req.getPathInfo();
                String method = req.getMethod();
                Object body;
                try {
                    body = switch (method + " " + path) {
                        case "GET /counts" -> json.valueToTree(store.counts(Serve.LISTED));
                        case "POST /reset" -> {
                            reset();
                            yield json.createObjectNode().put("reset", true);
                        }
                        case "POST /fail" -> fail(req);
                        case "GET /requests" -> requests();
                        case "GET /auth" -> auth.status();
                        case "POST /revoke" -> auth.revoke();
                        case "POST /token-fail" -> auth.failTokens(intParam(req, "status", 503),
                                intParam(req, "count", 1));
                        case "POST /smart" -> auth.smartOverrides(req.getParameter("tokenEndpoint"),
                                req.getParameter("expiresIn"));
                        default -> null;
                    };
                } catch (IllegalArgumentException e) {
                    sendJson(resp, 400, json.createObjectNode().put("error", e.getMessage()));
                    return;
                }
                if (body == null) {
                    sendJson(resp, 404, json.createObjectNode().put("error", "no such control: " + method + " /admin" + path
                            + " (GET counts, GET requests, GET auth, POST fail?status=&count=&retryAfter=&delayMs=, POST reset,"
                            + " POST revoke, POST token-fail?status=&count=, POST smart?tokenEndpoint=&expiresIn=)"));
                    return;
                }
                sendJson(resp, 200, body);
            }
        };
    }

    private synchronized ObjectNode fail(HttpServletRequest req) {
        int status = intParam(req, "status", 503);
        int count = intParam(req, "count", 1);
        long delay = intParam(req, "delayMs", 0);
        if ((status != 0 && (status < 100 || status > 599)) || count < 0) {
            throw new IllegalArgumentException("status must be 100-599 (or 0: only delay), count >= 0");
        }
        failStatus = status;
        failCount = count;
        failDelayMs = delay;
        failRetryAfter = req.getParameter("retryAfter");
        ObjectNode o = json.createObjectNode().put("status", status).put("count", count).put("delayMs", delay);
        if (failRetryAfter != null) {
            o.put("retryAfter", failRetryAfter);
        }
        return o;
    }

    private synchronized ObjectNode requests() {
        ObjectNode o = json.createObjectNode();
        o.put("total", logged);
        ArrayNode a = o.putArray("requests");
        log.forEach(a::add);
        return o;
    }

    private static int intParam(HttpServletRequest req, String name, int dflt) {
        String v = req.getParameter(name);
        if (v == null || v.isEmpty()) {
            return dflt;
        }
        try {
            return Integer.parseInt(v);
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException(name + " must be a number, not " + v);
        }
    }

    /** One entry per request to /fhir: method, path, query, status, ms, and the headers the tests check. */
    HttpFilter logFilter() {
        return (req, resp, chain) -> {
            if (!logging) {
                // Starting: only the warm-up's own requests go through. Anything else would land in the
                // store that the reset before `listening` empties: a client that connected early (a
                // retrying egress) is told to come back, as a server that is starting would.
                if (req.getHeader(WARMUP_HEADER) != null) {
                    chain.doFilter(req, resp);
                } else {
                    resp.setHeader("Retry-After", "1");
                    sendOutcome(resp, 503, "transient", "the server is starting");
                }
                return;
            }
            long t0 = System.nanoTime();
            long at = System.currentTimeMillis();
            int status = 500;
            try {
                chain.doFilter(req, resp);
                status = resp.getStatus();
            } finally {
                ObjectNode e = json.createObjectNode();
                e.put("at", at);
                e.put("method", req.getMethod());
                e.put("path", req.getRequestURI());
                e.put("query", req.getQueryString());
                e.put("status", status);
                e.put("ms", Math.round((System.nanoTime() - t0) / 1e4) / 100.0);
                e.put("protocol", req.getProtocol());
                e.put("contentType", req.getContentType());
                e.put("bytes", req.getContentLengthLong());
                e.put("ifNoneExist", req.getHeader("If-None-Exist"));
                e.put("authorization", req.getHeader("Authorization"));
                e.put("clientCn", Auth.clientCn(req));
                synchronized (Admin.this) {
                    logged++;
                    log.addLast(e);
                    while (log.size() > LOG_LIMIT) {
                        log.removeFirst();
                    }
                }
            }
        };
    }

    /** The next `count` requests get the status set by POST /admin/fail, with Retry-After when one was given. */
    HttpFilter failFilter() {
        return (req, resp, chain) -> {
            int status;
            long delay;
            String retryAfter;
            synchronized (Admin.this) {
                if (failCount <= 0) {
                    status = -1;
                    delay = 0;
                    retryAfter = null;
                } else {
                    failCount--;
                    status = failStatus;
                    delay = failDelayMs;
                    retryAfter = failRetryAfter;
                }
            }
            if (delay > 0) {
                try {
                    Thread.sleep(delay);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            }
            if (status <= 0) {
                chain.doFilter(req, resp);
                return;
            }
            if (retryAfter != null) {
                resp.setHeader("Retry-After", retryAfter);
            }
            sendOutcome(resp, status, status == 429 ? "throttled" : "transient",
                    "injected by POST /admin/fail (status " + status + ")");
        };
    }
}
