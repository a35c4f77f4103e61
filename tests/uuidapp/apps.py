from django.apps import AppConfig


class UuidAppConfig(AppConfig):
    name = "tests.uuidapp"
    label = "uuidapp"
    default_auto_field = "django.db.models.BigAutoField"
