package io.hl7gw.fhir;

import ca.uhn.fhir.context.FhirContext;
import ca.uhn.fhir.context.RuntimeSearchParam;
import ca.uhn.fhir.fhirpath.IFhirPath;
import ca.uhn.fhir.rest.server.exceptions.InvalidRequestException;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.text.Normalizer;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import org.hl7.fhir.instance.model.api.IBase;
import org.hl7.fhir.instance.model.api.IBaseResource;
import org.hl7.fhir.instance.model.api.IPrimitiveType;
import org.hl7.fhir.r4.model.Address;
import org.hl7.fhir.r4.model.BaseDateTimeType;
import org.hl7.fhir.r4.model.CodeableConcept;
import org.hl7.fhir.r4.model.Coding;
import org.hl7.fhir.r4.model.ContactPoint;
import org.hl7.fhir.r4.model.Enumeration;
import org.hl7.fhir.r4.model.HumanName;
import org.hl7.fhir.r4.model.Identifier;
import org.hl7.fhir.r4.model.Period;
import org.hl7.fhir.r4.model.Reference;

/**
 * Search parameters, matched in memory: the resource type's own parameters from HAPI's R4 definitions,
 * evaluated with their FHIRPath expressions. Token (system|code, |code, system|, code; :not), reference
 * (Type/id, id, absolute URL), string (starts-with, case- and accent-insensitive; :exact, :contains), date
 * (equality at the precision given, `eq` prefix only), uri (equality) and `_id`. Values separated by commas
 * are alternatives; a parameter repeated must match each time. Other control parameters (`_count`, `_total`,
 * `_sort`, `_summary`, ...) are left to HAPI; any other parameter or modifier is refused with a 400.
 */
final class Query {
    private final FhirContext ctx;
    private final IFhirPath fhirPath;

    Query(FhirContext ctx) {
        this.ctx = ctx;
        this.fhirPath = ctx.newFhirPath();
    }

    /** `a=1&b=2` (the part after `?` of a conditional URL; a leading `Type?` is dropped) → decoded parameters. */
    static Map<String, List<String>> parse(String query) {
        Map<String, List<String>> out = new LinkedHashMap<>();
        if (query == null) {
            return out;
        }
        int q = query.indexOf('?');
        if (q >= 0) {
            query = query.substring(q + 1);
        }
        for (String pair : query.split("&")) {
            if (pair.isEmpty()) {
                continue;
            }
            int eq = pair.indexOf('=');
            String k = URLDecoder.decode(eq < 0 ? pair : pair.substring(0, eq), StandardCharsets.UTF_8);
            String v = eq < 0 ? "" : URLDecoder.decode(pair.substring(eq + 1), StandardCharsets.UTF_8);
            out.computeIfAbsent(k, x -> new ArrayList<>()).add(v);
        }
        return out;
    }

    /** Whether the parameters (with at least one real criterion) select anything: conditional URLs need one. */
    static boolean hasCriteria(Map<String, List<String>> params) {
        return params.keySet().stream().anyMatch(k -> k.equals("_id") || !k.startsWith("_"));
    }

    /** Refuses, before anything is matched, parameters this server does not know for the type. */
    void check(String type, Map<String, List<String>> params) {
        for (String key : params.keySet()) {
            param(type, key);
        }
    }

    boolean matches(String type, IBaseResource r, Map<String, List<String>> params) {
        for (Map.Entry<String, List<String>> e : params.entrySet()) {
            Param p = param(type, e.getKey());
            if (p == null) {
                continue;
            }
            for (String v : e.getValue()) {
                boolean any = false;
                for (String alt : splitCommas(v)) {
                    if (matchOne(r, p, alt)) {
                        any = true;
                        break;
                    }
                }
                if (p.modifier.equals("not") ? any : !any) {
                    return false;
                }
            }
        }
        return true;
    }

    private record Param(String name, String modifier, RuntimeSearchParam def) {}

    /** The parameter's definition, null for a control parameter HAPI handles; 400 for one not supported. */
    private Param param(String type, String key) {
        int colon = key.indexOf(':');
        String name = colon < 0 ? key : key.substring(0, colon);
        String modifier = colon < 0 ? "" : key.substring(colon + 1);
        if (name.equals("_id")) {
            if (!modifier.isEmpty()) {
                throw new InvalidRequestException("_id takes no modifier here");
            }
            return new Param(name, modifier, null);
        }
        if (name.startsWith("_")) {
            return null;
        }
        RuntimeSearchParam def = ctx.getResourceDefinition(type).getSearchParam(name);
        if (def == null) {
            throw new InvalidRequestException("Unknown search parameter '" + name + "' for resource type " + type);
        }
        String ok = switch (def.getParamType()) {
            case TOKEN -> "|not|";
            case STRING -> "|exact|contains|";
            case REFERENCE, DATE, URI -> "|";
            default -> throw new InvalidRequestException(
                    "Search parameter '" + name + "' (" + def.getParamType() + ") is not supported by this test server");
        };
        if (!modifier.isEmpty() && !ok.contains("|" + modifier + "|")) {
            throw new InvalidRequestException("Modifier ':" + modifier + "' is not supported here for '" + name + "'");
        }
        return new Param(name, modifier, def);
    }

    private boolean matchOne(IBaseResource r, Param p, String value) {
        if (p.def == null) { // _id
            return value.equals(r.getIdElement().getIdPart());
        }
        for (IBase v : values(r, p.def)) {
            boolean hit = switch (p.def.getParamType()) {
                case TOKEN -> token(v, value);
                case REFERENCE -> reference(v, value);
                case STRING -> string(v, value, p.modifier);
                case DATE -> date(v, value);
                case URI -> v instanceof IPrimitiveType<?> pt && value.equals(pt.getValueAsString());
                default -> false;
            };
            if (hit) {
                return true;
            }
        }
        return false;
    }

    private List<IBase> values(IBaseResource r, RuntimeSearchParam def) {
        String path = def.getPath();
        if (path == null || path.isBlank()) {
            throw new InvalidRequestException("Search parameter '" + def.getName() + "' has no path");
        }
        // `.where(resolve() is Patient)`: nothing is resolved here; the value's own reference is compared.
        path = path.replaceAll("\\.where\\(\\s*resolve\\(\\)\\s+is\\s+[A-Za-z]+\\s*\\)", "");
        return fhirPath.evaluate(r, path, IBase.class);
    }

    private static boolean token(IBase v, String query) {
        int bar = indexUnescaped(query, '|');
        String system = bar < 0 ? null : unescape(query.substring(0, bar));
        String code = unescape(bar < 0 ? query : query.substring(bar + 1));
        if (v instanceof Identifier id) {
            return tokenMatch(system, code, id.getSystem(), id.getValue());
        }
        if (v instanceof Coding c) {
            return tokenMatch(system, code, c.getSystem(), c.getCode());
        }
        if (v instanceof CodeableConcept cc) {
            return cc.getCoding().stream().anyMatch(c -> tokenMatch(system, code, c.getSystem(), c.getCode()));
        }
        if (v instanceof ContactPoint cp) {
            return tokenMatch(null, code, null, cp.getValue());
        }
        if (v instanceof Enumeration<?> en) {
            return tokenMatch(system, code, en.getSystem(), en.getValueAsString());
        }
        if (v instanceof IPrimitiveType<?> pt) {
            return tokenMatch(null, code, null, pt.getValueAsString());
        }
        return false;
    }

    /** `system|code`, `|code` (no system), `system|` (any code), `code` (any system). */
    private static boolean tokenMatch(String qSystem, String qCode, String system, String code) {
        if (qSystem != null) {
            if (qSystem.isEmpty() ? system != null && !system.isEmpty() : !qSystem.equals(system)) {
                return false;
            }
        }
        return qCode.isEmpty() ? qSystem != null : qCode.equals(code);
    }

    private static boolean reference(IBase v, String query) {
        String ref = v instanceof Reference r ? r.getReference()
                : v instanceof IPrimitiveType<?> pt ? pt.getValueAsString() : null;
        if (ref == null) {
            return false;
        }
        int h = ref.indexOf("/_history/");
        if (h >= 0) {
            ref = ref.substring(0, h);
        }
        if (query.contains("/")) {
            return ref.equals(query) || ref.endsWith("/" + query) || query.endsWith("/" + ref);
        }
        return ref.substring(ref.lastIndexOf('/') + 1).equals(query);
    }

    private static boolean string(IBase v, String query, String modifier) {
        List<String> texts = new ArrayList<>();
        if (v instanceof HumanName n) {
            texts.add(n.getFamily());
            texts.add(n.getText());
            n.getGiven().forEach(g -> texts.add(g.getValue()));
            n.getPrefix().forEach(g -> texts.add(g.getValue()));
            n.getSuffix().forEach(g -> texts.add(g.getValue()));
        } else if (v instanceof Address a) {
            a.getLine().forEach(l -> texts.add(l.getValue()));
            texts.add(a.getCity());
            texts.add(a.getDistrict());
            texts.add(a.getState());
            texts.add(a.getPostalCode());
            texts.add(a.getCountry());
            texts.add(a.getText());
        } else if (v instanceof IPrimitiveType<?> pt) {
            texts.add(pt.getValueAsString());
        }
        for (String t : texts) {
            if (t == null) {
                continue;
            }
            boolean hit = switch (modifier) {
                case "exact" -> t.equals(query);
                case "contains" -> fold(t).contains(fold(query));
                default -> fold(t).startsWith(fold(query));
            };
            if (hit) {
                return true;
            }
        }
        return false;
    }

    private static boolean date(IBase v, String query) {
        if (query.startsWith("eq")) {
            query = query.substring(2);
        } else if (query.length() > 2 && Character.isLetter(query.charAt(0))) {
            throw new InvalidRequestException("Date prefixes other than 'eq' are not supported by this test server");
        }
        String s = v instanceof BaseDateTimeType d ? d.getValueAsString()
                : v instanceof Period p && p.hasStart() ? p.getStartElement().getValueAsString() : null;
        return s != null && s.startsWith(query);
    }

    private static String fold(String s) {
        return Normalizer.normalize(s, Normalizer.Form.NFD).replaceAll("\\p{M}", "").toLowerCase(Locale.ROOT);
    }

    private static List<String> splitCommas(String v) {
        List<String> out = new ArrayList<>();
        StringBuilder cur = new StringBuilder();
        for (int i = 0; i < v.length(); i++) {
            char c = v.charAt(i);
            if (c == '\\' && i + 1 < v.length()) {
                cur.append(c).append(v.charAt(++i));
            } else if (c == ',') {
                out.add(cur.toString());
                cur.setLength(0);
            } else {
                cur.append(c);
            }
        }
        out.add(cur.toString());
        return out;
    }

    private static int indexUnescaped(String s, char ch) {
        for (int i = 0; i < s.length(); i++) {
            if (s.charAt(i) == '\\') {
                i++;
            } else if (s.charAt(i) == ch) {
                return i;
            }
        }
        return -1;
    }

    private static String unescape(String s) {
        return s.replaceAll("\\\\([\\\\,|$])", "$1");
    }
}
