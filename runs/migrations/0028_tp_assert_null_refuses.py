from django.db import migrations

# tp_assert refuses a NULL condition as it refuses a false one: a guard whose read found
# nothing (a comparison with NULL is NULL) must not let its statement through.
STRICT = """
CREATE OR REPLACE FUNCTION tp_assert(ok boolean, message text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF ok IS NOT TRUE THEN
        RAISE EXCEPTION USING ERRCODE = 'TP001', MESSAGE = message;
    END IF;
    RETURN true;
END $$;
"""

LENIENT = STRICT.replace("IF ok IS NOT TRUE THEN", "IF NOT ok THEN")


class Migration(migrations.Migration):
    dependencies = [("runs", "0027_notify_takeovers")]

    operations = [migrations.RunSQL(STRICT, LENIENT)]
