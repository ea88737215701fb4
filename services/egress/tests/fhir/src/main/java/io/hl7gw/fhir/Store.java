package io.hl7gw.fhir;

import ca.uhn.fhir.context.FhirContext;
import ca.uhn.fhir.parser.IParser;
import ca.uhn.fhir.rest.server.exceptions.BaseServerResponseException;
import ca.uhn.fhir.rest.server.exceptions.InvalidRequestException;
import ca.uhn.fhir.rest.server.exceptions.PreconditionFailedException;
import ca.uhn.fhir.rest.server.exceptions.ResourceNotFoundException;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Date;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import org.hl7.fhir.instance.model.api.IBaseResource;
import org.hl7.fhir.r4.model.Bundle;
import org.hl7.fhir.r4.model.Bundle.BundleEntryComponent;
import org.hl7.fhir.r4.model.Bundle.BundleEntryResponseComponent;
import org.hl7.fhir.r4.model.Bundle.HTTPVerb;
import org.hl7.fhir.r4.model.IdType;
import org.hl7.fhir.r4.model.InstantType;
import org.hl7.fhir.r4.model.MessageHeader;
import org.hl7.fhir.r4.model.OperationOutcome;
import org.hl7.fhir.r4.model.Reference;
import org.hl7.fhir.r4.model.Resource;

/**
 * The server's resources, in memory: current versions only (no history), one lock for everything, so a
 * transaction Bundle is applied whole or not at all (its writes are undone when an entry fails). Ids the server
 * assigns are decimal numbers from one counter over all types; clients may PUT their own ids.
 */
final class Store {
    record Stored(String type, String id, long version, Instant lastUpdated, Resource resource, String canonical) {
        String location() {
            return type + "/" + id + "/_history/" + version;
        }
    }

    /** What one write did: `status` is 201 (created) or 200 (matched, updated or unchanged). */
    record Outcome(Stored stored, int status) {}

    /** Undo log of one atomic step. */
    private static final class Tx {
        final List<Object[]> undo = new ArrayList<>(); // {type, id, previous Stored or null}
    }

    private final FhirContext ctx;
    private final IParser parser;
    private final Query query;
    private final Map<String, Map<String, Stored>> data = new TreeMap<>();
    private final Set<String> served;
    private long nextId = 1;

    Store(FhirContext ctx, Set<String> served) {
        this.ctx = ctx;
        this.served = served;
        this.parser = ctx.newJsonParser();
        this.query = new Query(ctx);
    }

    // ---- single operations (the REST API's create, update, read, delete, search) ----

    synchronized Outcome create(String type, IBaseResource r, String ifNoneExist) {
        Tx tx = new Tx();
        return atomically(tx, () -> {
            if (ifNoneExist != null && !ifNoneExist.isBlank()) {
                Stored m = matchOne(type, ifNoneExist, "If-None-Exist");
                if (m != null) {
                    return new Outcome(m, 200);
                }
            }
            return put(tx, type, newId(), (Resource) r);
        });
    }

    synchronized Outcome update(String type, String id, IBaseResource r) {
        Tx tx = new Tx();
        return atomically(tx, () -> put(tx, type, id, (Resource) r));
    }

    synchronized Outcome conditionalUpdate(String type, String conditional, IBaseResource r) {
        Tx tx = new Tx();
        return atomically(tx, () -> put(tx, type, conditionalTarget(type, conditional, (Resource) r), (Resource) r));
    }

    synchronized Resource read(String type, String id) {
        Stored s = data.getOrDefault(type, Map.of()).get(id);
        if (s == null) {
            throw new ResourceNotFoundException(new IdType(type, id));
        }
        return copy(s.resource);
    }

    synchronized int delete(String type, String id, String conditional) {
        Tx tx = new Tx();
        return atomically(tx, () -> {
            if (conditional != null) {
                List<Stored> hits = search(type, Query.parse(conditional));
                if (hits.size() > 1) {
                    throw new PreconditionFailedException("Conditional delete matched " + hits.size() + " resources");
                }
                hits.forEach(h -> remove(tx, type, h.id));
                return hits.size();
            }
            return remove(tx, type, id) ? 1 : 0;
        });
    }

    synchronized List<Stored> search(String type, Map<String, List<String>> params) {
        query.check(type, params);
        List<Stored> out = new ArrayList<>();
        for (Stored s : data.getOrDefault(type, Map.of()).values()) {
            if (query.matches(type, s.resource, params)) {
                out.add(s);
            }
        }
        return out;
    }

    synchronized List<Resource> searchCopies(String type, Map<String, List<String>> params) {
        return search(type, params).stream().map(s -> copy(s.resource)).toList();
    }

    synchronized Map<String, Integer> counts(Set<String> always) {
        Map<String, Integer> out = new TreeMap<>();
        always.forEach(t -> out.put(t, 0));
        data.forEach((t, m) -> {
            if (!m.isEmpty()) {
                out.put(t, m.size());
            }
        });
        return out;
    }

    synchronized void reset() {
        data.clear();
    }

    // ---- Bundles ----

    /** A `transaction` (atomic) or `batch` (each entry on its own) Bundle → its response Bundle. */
    synchronized Bundle transaction(Bundle in) {
        Bundle.BundleType type = in.getType();
        if (type == Bundle.BundleType.BATCH) {
            Bundle out = new Bundle().setType(Bundle.BundleType.BATCHRESPONSE);
            for (BundleEntryComponent e : in.getEntry()) {
                Tx tx = new Tx();
                try {
                    out.addEntry(atomically(tx, () -> entries(tx, List.of(e), false).get(0)));
                } catch (BaseServerResponseException ex) {
                    BundleEntryComponent r = new BundleEntryComponent();
                    r.getResponse().setStatus(Integer.toString(ex.getStatusCode()))
                            .setOutcome(outcome(ex.getMessage()));
                    out.addEntry(r);
                }
            }
            return out;
        }
        if (type != Bundle.BundleType.TRANSACTION) {
            throw new InvalidRequestException("Bundle.type must be 'transaction' or 'batch' here, not '"
                    + (type == null ? "" : type.toCode()) + "'");
        }
        Tx tx = new Tx();
        List<BundleEntryComponent> responses = atomically(tx, () -> entries(tx, in.getEntry(), false));
        Bundle out = new Bundle().setType(Bundle.BundleType.TRANSACTIONRESPONSE);
        responses.forEach(out::addEntry);
        return out;
    }

    /**
     * A `message` Bundle ($process-message): every entry's resource is stored, upserted by its id when it has
     * one, else by its first identifier with a system and a value (a conditional update), else created; so a
     * second delivery of the same message adds nothing but the resources with neither. References to other
     * entries' fullUrls are rewritten. Returns the response message (MessageHeader.response.code ok).
     */
    synchronized Bundle processMessage(Bundle in) {
        if (in.getType() != Bundle.BundleType.MESSAGE) {
            throw new InvalidRequestException("$process-message takes a Bundle of type 'message'");
        }
        if (in.getEntry().isEmpty() || !(in.getEntryFirstRep().getResource() instanceof MessageHeader header)) {
            throw new InvalidRequestException("The first entry of a message Bundle must be a MessageHeader");
        }
        List<BundleEntryComponent> asTx = new ArrayList<>();
        for (BundleEntryComponent e : in.getEntry()) {
            Resource r = e.getResource();
            if (r == null) {
                continue;
            }
            BundleEntryComponent t = new BundleEntryComponent().setFullUrl(e.getFullUrl()).setResource(r);
            String rt = r.fhirType();
            String id = bodyId(r);
            String identifier = id == null ? firstIdentifier(r) : null;
            if (id != null) {
                t.getRequest().setMethod(HTTPVerb.PUT).setUrl(rt + "/" + id);
            } else if (identifier != null) {
                t.getRequest().setMethod(HTTPVerb.PUT).setUrl(rt + "?identifier=" + identifier);
            } else {
                t.getRequest().setMethod(HTTPVerb.POST).setUrl(rt);
            }
            asTx.add(t);
        }
        Tx tx = new Tx();
        atomically(tx, () -> entries(tx, asTx, true));
        MessageHeader rh = new MessageHeader();
        rh.setId(java.util.UUID.randomUUID().toString());
        rh.setEvent(header.getEvent());
        rh.getSource().setEndpoint("http://127.0.0.1/fhir-harness");
        rh.getResponse().setIdentifier(header.getIdElement().getIdPart() == null ? "unknown"
                : header.getIdElement().getIdPart()).setCode(MessageHeader.ResponseType.OK);
        Bundle out = new Bundle().setType(Bundle.BundleType.MESSAGE);
        out.setId(java.util.UUID.randomUUID().toString());
        out.setTimestamp(new Date());
        out.addEntry().setFullUrl("urn:uuid:" + rh.getId()).setResource(rh);
        return out;
    }

    private enum Action { CREATE, UPDATE, MATCHED, DELETE, READ }

    private static final class Plan {
        Action action;
        String type;
        String id;
        Resource resource;
        BundleEntryComponent response;
    }

    /**
     * Applies entries as one step (the caller's transaction): conditions are evaluated against the store as it
     * was before the Bundle (after its deletes), every entry's target id is fixed, then references are rewritten
     * (fullUrl → Type/id, conditional references resolved), then the writes happen. The FHIR order: DELETE,
     * POST, PUT, GET; responses in the request order.
     */
    private List<BundleEntryComponent> entries(Tx tx, List<BundleEntryComponent> entries, boolean message) {
        int n = entries.size();
        Plan[] plans = new Plan[n];
        Map<String, String> fullUrls = new HashMap<>();
        Set<String> conditions = new HashSet<>();
        for (int i = 0; i < n; i++) {
            BundleEntryComponent e = entries.get(i);
            if (!e.hasRequest() || e.getRequest().getMethod() == null || !e.getRequest().hasUrl()) {
                throw new InvalidRequestException("Bundle.entry[" + i + "] has no request.method and request.url");
            }
            if (e.hasFullUrl() && fullUrls.put(e.getFullUrl(), "") != null) {
                throw new InvalidRequestException("Bundle.entry[" + i + "]: fullUrl " + e.getFullUrl() + " appears twice");
            }
        }
        fullUrls.clear();
        // DELETE first.
        for (int i = 0; i < n; i++) {
            BundleEntryComponent e = entries.get(i);
            if (e.getRequest().getMethod() == HTTPVerb.DELETE) {
                String url = e.getRequest().getUrl();
                String type = typeOf(url, i);
                Plan p = plans[i] = new Plan();
                p.action = Action.DELETE;
                p.type = type;
                int deleted;
                if (url.contains("?")) {
                    List<Stored> hits = search(type, Query.parse(url));
                    if (hits.size() > 1) {
                        throw new PreconditionFailedException("Bundle.entry[" + i + "]: conditional delete matched "
                                + hits.size() + " resources");
                    }
                    hits.forEach(h -> remove(tx, type, h.id));
                    deleted = hits.size();
                } else {
                    deleted = remove(tx, type, idOf(url, i)) ? 1 : 0;
                }
                p.response = new BundleEntryComponent();
                p.response.getResponse().setStatus(deleted > 0 ? "204 No Content" : "404 Not Found");
            }
        }
        // POST and PUT: fix the targets.
        for (int i = 0; i < n; i++) {
            BundleEntryComponent e = entries.get(i);
            HTTPVerb m = e.getRequest().getMethod();
            if (m != HTTPVerb.POST && m != HTTPVerb.PUT) {
                if (m != HTTPVerb.DELETE && m != HTTPVerb.GET && m != HTTPVerb.HEAD) {
                    throw new InvalidRequestException("Bundle.entry[" + i + "]: method " + m.toCode() + " is not supported here");
                }
                continue;
            }
            String url = e.getRequest().getUrl();
            Resource r = e.getResource();
            if (r == null) {
                throw new InvalidRequestException("Bundle.entry[" + i + "] (" + m.toCode() + ") has no resource");
            }
            String type = typeOf(url, i);
            if (!type.equals(r.fhirType())) {
                throw new InvalidRequestException("Bundle.entry[" + i + "]: request.url " + url + " does not name the type of its "
                        + r.fhirType());
            }
            Plan p = plans[i] = new Plan();
            p.type = type;
            p.resource = r.copy();
            if (m == HTTPVerb.POST) {
                if (url.contains("?")) {
                    throw new InvalidRequestException("Bundle.entry[" + i + "]: POST takes its condition in request.ifNoneExist");
                }
                String cond = e.getRequest().getIfNoneExist();
                Stored hit = null;
                if (cond != null && !cond.isBlank()) {
                    if (!conditions.add(type + "?" + cond)) {
                        throw new InvalidRequestException("Bundle.entry[" + i + "]: the condition " + type + "?" + cond
                                + " appears twice in this Bundle");
                    }
                    hit = matchOne(type, cond, "Bundle.entry[" + i + "].request.ifNoneExist");
                }
                if (hit != null) {
                    p.action = Action.MATCHED;
                    p.id = hit.id;
                } else {
                    p.action = Action.CREATE;
                    p.id = newId();
                }
            } else if (url.contains("?")) {
                if (!conditions.add(url)) {
                    throw new InvalidRequestException("Bundle.entry[" + i + "]: the condition " + url + " appears twice in this Bundle");
                }
                p.action = Action.UPDATE;
                p.id = conditionalTarget(type, url, r);
            } else {
                p.action = Action.UPDATE;
                p.id = idOf(url, i);
                if (bodyId(r) != null && !bodyId(r).equals(p.id)) {
                    throw new InvalidRequestException("Bundle.entry[" + i + "]: resource id " + bodyId(r)
                            + " differs from request.url " + url);
                }
            }
            if (e.hasFullUrl()) {
                fullUrls.put(e.getFullUrl(), type + "/" + p.id);
            }
        }
        // References.
        for (int i = 0; i < n; i++) {
            Plan p = plans[i];
            if (p == null || p.resource == null || p.action == Action.MATCHED) {
                continue;
            }
            for (Reference ref : ctx.newTerser().getAllPopulatedChildElementsOfType(p.resource, Reference.class)) {
                String v = ref.getReference();
                if (v == null || v.startsWith("#")) {
                    continue;
                }
                String target = fullUrls.get(v);
                if (target != null) {
                    ref.setReference(target);
                } else if (v.startsWith("urn:uuid:") || v.startsWith("urn:oid:")) {
                    throw new InvalidRequestException("Bundle.entry[" + i + "]: reference " + v
                            + " names no entry's fullUrl in this Bundle");
                } else if (v.contains("?")) {
                    String rt = typeOf(v, i);
                    Stored hit = matchOne(rt, v, "Bundle.entry[" + i + "]: conditional reference");
                    if (hit == null) {
                        throw new InvalidRequestException("Bundle.entry[" + i + "]: conditional reference " + v + " matches nothing");
                    }
                    ref.setReference(rt + "/" + hit.id);
                }
            }
        }
        // Writes: POST, then PUT.
        for (HTTPVerb phase : new HTTPVerb[] {HTTPVerb.POST, HTTPVerb.PUT}) {
            for (int i = 0; i < n; i++) {
                Plan p = plans[i];
                if (p == null || entries.get(i).getRequest().getMethod() != phase) {
                    continue;
                }
                Outcome o = p.action == Action.MATCHED
                        ? new Outcome(data.get(p.type).get(p.id), 200)
                        : put(tx, p.type, p.id, p.resource);
                p.response = response(o);
            }
        }
        // GET and HEAD: reads and searches after the writes.
        for (int i = 0; i < n; i++) {
            BundleEntryComponent e = entries.get(i);
            HTTPVerb m = e.getRequest().getMethod();
            if (m != HTTPVerb.GET && m != HTTPVerb.HEAD) {
                continue;
            }
            String url = e.getRequest().getUrl();
            String type = typeOf(url, i);
            Plan p = plans[i] = new Plan();
            p.response = new BundleEntryComponent();
            if (url.contains("?") || !url.contains("/")) {
                Bundle found = new Bundle().setType(Bundle.BundleType.SEARCHSET);
                List<Stored> hits = search(type, Query.parse(url));
                found.setTotal(hits.size());
                hits.forEach(s -> found.addEntry().setFullUrl(s.type + "/" + s.id).setResource(copy(s.resource)));
                p.response.setResource(found);
            } else {
                p.response.setResource(read(type, idOf(url, i)));
            }
            p.response.getResponse().setStatus("200 OK");
        }
        List<BundleEntryComponent> out = new ArrayList<>(n);
        for (Plan p : plans) {
            out.add(p.response);
        }
        return out;
    }

    // ---- helpers ----

    private interface Step<T> {
        T run();
    }

    private <T> T atomically(Tx tx, Step<T> step) {
        try {
            return step.run();
        } catch (RuntimeException e) {
            for (int i = tx.undo.size() - 1; i >= 0; i--) {
                Object[] u = tx.undo.get(i);
                Map<String, Stored> m = data.computeIfAbsent((String) u[0], k -> new LinkedHashMap<>());
                if (u[2] == null) {
                    m.remove((String) u[1]);
                } else {
                    m.put((String) u[1], (Stored) u[2]);
                }
            }
            throw e;
        }
    }

    /** The single match of a condition, null for none, 412 for several; the condition needs a criterion. */
    private Stored matchOne(String type, String condition, String what) {
        Map<String, List<String>> params = Query.parse(condition);
        if (!Query.hasCriteria(params)) {
            throw new InvalidRequestException(what + " has no search criterion: " + condition);
        }
        List<Stored> hits = search(type, params);
        if (hits.size() > 1) {
            throw new PreconditionFailedException(what + " " + condition + " matches " + hits.size() + " " + type
                    + " resources (at most one may match)");
        }
        return hits.isEmpty() ? null : hits.get(0);
    }

    /** Conditional update's target: the one match, else the body's id, else a new id. */
    private String conditionalTarget(String type, String conditional, Resource r) {
        Stored hit = matchOne(type, conditional, "Conditional update");
        String bodyId = bodyId(r);
        if (hit != null) {
            if (bodyId != null && !bodyId.equals(hit.id)) {
                throw new InvalidRequestException("Conditional update " + conditional + " matches " + type + "/" + hit.id
                        + " but the resource's id is " + bodyId);
            }
            return hit.id;
        }
        return bodyId != null ? bodyId : newId();
    }

    /**
     * The resource's own id, null for none. HAPI's parser gives an entry's resource its fullUrl as id when the
     * resource has none: a `urn:uuid:`/`urn:oid:` one is no id.
     */
    static String bodyId(Resource r) {
        if (!r.hasIdElement() || r.getIdElement().isEmpty()) {
            return null;
        }
        String v = r.getIdElement().getValue();
        if (v == null || v.startsWith("urn:")) {
            return null;
        }
        return r.getIdElement().getIdPart();
    }

    /** `system|value` of the resource's first identifier having both (escaped for a token search), or null. */
    private String firstIdentifier(Resource r) {
        if (ctx.getResourceDefinition(r).getChildByName("identifier") == null
                || ctx.getResourceDefinition(r).getSearchParam("identifier") == null) {
            return null;
        }
        for (org.hl7.fhir.r4.model.Identifier i : ctx.newTerser().getValues(r, "identifier",
                org.hl7.fhir.r4.model.Identifier.class)) {
            if (i.hasSystem() && i.hasValue()) {
                return escape(i.getSystem()) + "|" + escape(i.getValue());
            }
        }
        return null;
    }

    private static String escape(String s) {
        return java.net.URLEncoder.encode(s.replace("\\", "\\\\").replace("|", "\\|").replace(",", "\\,")
                .replace("$", "\\$"), java.nio.charset.StandardCharsets.UTF_8);
    }

    private Outcome put(Tx tx, String type, String id, Resource r) {
        if (!id.matches("[A-Za-z0-9\\-.]{1,64}")) {
            throw new InvalidRequestException("Invalid resource id: " + id);
        }
        Resource copy = r.copy();
        copy.setIdElement(new IdType(type, id));
        if (copy.hasMeta()) {
            copy.getMeta().setVersionIdElement(null).setLastUpdatedElement(null);
        }
        String canonical = parser.encodeResourceToString(copy);
        Map<String, Stored> m = data.computeIfAbsent(type, k -> new LinkedHashMap<>());
        Stored prev = m.get(id);
        if (prev != null && prev.canonical.equals(canonical)) {
            return new Outcome(prev, 200); // no change: no new version, as HAPI's JPA server does
        }
        long version = prev == null ? 1 : prev.version + 1;
        Instant now = Instant.now();
        copy.setIdElement(new IdType(type, id, Long.toString(version)));
        copy.getMeta().setVersionId(Long.toString(version)).setLastUpdatedElement(new InstantType(Date.from(now)));
        Stored s = new Stored(type, id, version, now, copy, canonical);
        tx.undo.add(new Object[] {type, id, prev});
        m.put(id, s);
        return new Outcome(s, prev == null ? 201 : 200);
    }

    private boolean remove(Tx tx, String type, String id) {
        Map<String, Stored> m = data.get(type);
        Stored prev = m == null ? null : m.remove(id);
        if (prev != null) {
            tx.undo.add(new Object[] {type, id, prev});
        }
        return prev != null;
    }

    private String newId() {
        return Long.toString(nextId++);
    }

    private Resource copy(Resource r) {
        return r.copy();
    }

    private String typeOf(String url, int i) {
        String path = url.contains("?") ? url.substring(0, url.indexOf('?')) : url;
        String type = path.contains("/") ? path.substring(0, path.indexOf('/')) : path;
        if (!served.contains(type)) {
            throw new InvalidRequestException("Bundle.entry[" + i + "]: request.url " + url
                    + (ctx.getResourceTypes().contains(type) ? " names a type this server was not started with (--types)"
                            : " names no R4 resource type"));
        }
        return type;
    }

    private static String idOf(String url, int i) {
        String[] parts = url.split("/");
        if (parts.length < 2 || parts[1].isEmpty()) {
            throw new InvalidRequestException("Bundle.entry[" + i + "]: request.url " + url + " names no id");
        }
        return parts[1];
    }

    static BundleEntryComponent response(Outcome o) {
        BundleEntryComponent e = new BundleEntryComponent();
        BundleEntryResponseComponent r = e.getResponse();
        r.setStatus(o.status == 201 ? "201 Created" : "200 OK");
        r.setLocation(o.stored.location());
        r.setEtag("W/\"" + o.stored.version + "\"");
        r.setLastModified(Date.from(o.stored.lastUpdated));
        return e;
    }

    static OperationOutcome outcome(String message) {
        OperationOutcome oo = new OperationOutcome();
        oo.addIssue().setSeverity(OperationOutcome.IssueSeverity.ERROR).setCode(OperationOutcome.IssueType.PROCESSING)
                .setDiagnostics(message);
        return oo;
    }
}
