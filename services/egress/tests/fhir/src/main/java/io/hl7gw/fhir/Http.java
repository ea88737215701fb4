package io.hl7gw.fhir;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import jakarta.servlet.Filter;
import jakarta.servlet.FilterChain;
import jakarta.servlet.ServletException;
import jakarta.servlet.ServletRequest;
import jakarta.servlet.ServletResponse;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.io.IOException;

/** What the harness's own filters and servlets (Admin, Auth) answer with, and its filters' shape. */
final class Http {
    private static final ObjectMapper JSON = new ObjectMapper();

    private Http() {}

    /** A filter in front of /fhir, written as a lambda: the requests it sees are HTTP ones. */
    @FunctionalInterface
    interface HttpFilter extends Filter {
        void filter(HttpServletRequest req, HttpServletResponse resp, FilterChain chain)
                throws IOException, ServletException;

        @Override
        default void doFilter(ServletRequest req, ServletResponse resp, FilterChain chain)
                throws IOException, ServletException {
            filter((HttpServletRequest) req, (HttpServletResponse) resp, chain);
        }
    }

    /** The status and a JSON body (the /admin controls, the SMART endpoints). */
    static void sendJson(HttpServletResponse resp, int status, Object body) throws IOException {
        resp.setStatus(status);
        resp.setContentType("application/json");
        resp.getOutputStream().write(JSON.writeValueAsBytes(body));
    }

    /** The status and a FHIR OperationOutcome with one error issue: its code and diagnostics. */
    static void sendOutcome(HttpServletResponse resp, int status, String code, String diagnostics) throws IOException {
        resp.setStatus(status);
        resp.setContentType("application/fhir+json;charset=utf-8");
        ObjectNode oo = JSON.createObjectNode().put("resourceType", "OperationOutcome");
        oo.putArray("issue").addObject().put("severity", "error").put("code", code).put("diagnostics", diagnostics);
        resp.getOutputStream().write(JSON.writeValueAsBytes(oo));
    }
}
