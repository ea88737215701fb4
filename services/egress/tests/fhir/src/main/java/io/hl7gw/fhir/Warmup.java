package io.hl7gw.fhir;

/** A small transaction Bundle the server validates before it says it is listening. */
final class Warmup {
    private Warmup() {}

    static final String BUNDLE = """
            {"resourceType":"Bundle","type":"transaction","entry":[
              {"fullUrl":"urn:uuid:8d6f2c1e-0000-4000-8000-000000000001",
               "resource":{"resourceType":"Patient","identifier":[{"system":"urn:warmup","value":"1"}],
                 "name":[{"family":"Warm","given":["Up"]}],"gender":"unknown","birthDate":"1970-01-01"},
               "request":{"method":"POST","url":"Patient","ifNoneExist":"identifier=urn:warmup|1"}},
              {"fullUrl":"urn:uuid:8d6f2c1e-0000-4000-8000-000000000002",
               "resource":{"resourceType":"Encounter","status":"finished",
                 "class":{"system":"http://terminology.hl7.org/CodeSystem/v3-ActCode","code":"AMB"},
                 "subject":{"reference":"urn:uuid:8d6f2c1e-0000-4000-8000-000000000001"}},
               "request":{"method":"POST","url":"Encounter"}},
              {"fullUrl":"urn:uuid:8d6f2c1e-0000-4000-8000-000000000003",
               "resource":{"resourceType":"Observation","status":"final",
                 "code":{"coding":[{"system":"http://loinc.org","code":"8867-4"}]},
                 "subject":{"reference":"urn:uuid:8d6f2c1e-0000-4000-8000-000000000001"},
                 "valueQuantity":{"value":72,"unit":"/min","system":"http://unitsofmeasure.org","code":"/min"}},
               "request":{"method":"POST","url":"Observation"}}]}
            """;
}
