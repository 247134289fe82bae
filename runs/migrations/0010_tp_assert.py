from django.db import migrations

# The engine's one-round-trip transactions (runs/engine/batch.py) guard each compare-and-set
# with this: a change that matched no row raises, so the whole transaction rolls back.
CREATE = """
CREATE OR REPLACE FUNCTION tp_assert(ok boolean, message text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT ok THEN
        RAISE EXCEPTION USING ERRCODE = 'TP001', MESSAGE = message;
    END IF;
    RETURN true;
END $$;
"""


class Migration(migrations.Migration):
    dependencies = [("runs", "0009_apiclient_signing_version")]

    operations = [
        migrations.RunSQL(CREATE, "DROP FUNCTION IF EXISTS tp_assert(boolean, text)"),
    ]
